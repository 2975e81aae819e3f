"""What a loaded pipeline does when a request leaves a value out: its default step count and size.

Read on the engine's thread when a plan is announced (`PlanReady`), so the console's request dialog
knows them without touching the pipeline. Torch-free: it only inspects the pipeline object.
"""

from __future__ import annotations

import inspect
from typing import Any


def default_steps(pipe: Any) -> int | None:
    """The pipeline call's default `num_inference_steps`; None when it has no integer default."""
    parameter = inspect.signature(pipe.__call__).parameters.get("num_inference_steps")
    default = parameter.default if parameter is not None else None
    return int(default) if isinstance(default, int) else None


def default_side(pipe: Any) -> int | None:
    """The pipeline's own default height and width (`default_sample_size` × the VAE's scale) when its
    config gives one; None when the pipeline decides at call time."""
    sample = getattr(pipe, "default_sample_size", None)
    scale = getattr(pipe, "vae_scale_factor", None) or getattr(pipe, "vae_spatial_compression_ratio", None)
    if isinstance(sample, int) and isinstance(scale, int):
        return sample * scale
    return None
