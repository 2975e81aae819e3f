"""The request `run` makes when a flag is left out: the pipeline's defaults, or the demo model's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..engine.engine import Engine
from ..engine.runner import GenerateRequest


def default_request(engine: Engine, *, prompt: str, steps: int | None = None, height: int | None = None,
                    width: int | None = None, seed: int = 0, guidance: float | None = None,
                    frames: int | None = None, negative_prompt: str | None = None,
                    max_sequence_length: int | None = None, image: Path | None = None,
                    params: dict[str, Any] | None = None) -> GenerateRequest:
    """A request; for the demo model, unset fields take the demo's working defaults (64 px, 2 steps).
    Fields left None are not sent: the pipeline's own default applies."""
    from ..engine.demo_model import DEMO_GENERATION, is_demo_model

    extra: dict[str, Any] = {}
    if is_demo_model(engine.model.path):
        d = DEMO_GENERATION
        steps = steps if steps is not None else int(d["num_inference_steps"])
        height = height if height is not None else int(d["height"])
        width = width if width is not None else int(d["width"])
        guidance = guidance if guidance is not None else float(d["guidance_scale"])
        extra["max_sequence_length"] = d["max_sequence_length"]
    return GenerateRequest(prompt=prompt, steps=steps, height=height, width=width, seed=seed, guidance=guidance,
                           frames=frames, negative_prompt=negative_prompt, max_sequence_length=max_sequence_length,
                           image=image, params=dict(params or {}), extra=extra)
