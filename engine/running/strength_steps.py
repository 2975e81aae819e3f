"""Image-to-image `strength`, checked before load: a value diffusers refuses, or a step count it turns into
no denoising step at all, fails only after every weight has loaded (`strength should in [0.0, 1.0]`; SDXL
img2img at 2 steps and its default strength 0.3 runs `int(2 * 0.3) = 0` steps and fails reshaping an empty
tensor).

How many steps run is the pipeline's own `get_timesteps`, read from its source: most SD-family pipelines keep
`int(num_inference_steps * strength)` steps (rounded down), Flux-family ones `steps - int(steps - steps *
strength)` (rounded up). `denoising_start` (SDXL) replaces strength, so it is not checked then.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Mapping
from typing import Any, Literal

from ..errors import ConfigError

Rounding = Literal["down", "up"]


@functools.cache
def _rounding(pipeline: type) -> Rounding | None:
    """How the pipeline's `get_timesteps` turns steps x strength into a count (None: it has none we read)."""
    method = getattr(pipeline, "get_timesteps", None)
    try:
        source = inspect.getsource(method) if method is not None else ""
    except (OSError, TypeError):
        return None
    text = "".join(source.split())
    if "int(num_inference_steps*strength)" in text:
        return "down"
    if "num_inference_steps*strength" in text:
        return "up"
    return None


def steps_run(rounding: Rounding, steps: int, strength: float) -> int:
    """The denoising steps a request of `steps` at `strength` runs."""
    if rounding == "down":
        return min(int(steps * strength), steps)
    return steps - int(max(steps - min(steps * strength, steps), 0))


def _value(params: Mapping[str, Any], signature: Mapping[str, inspect.Parameter], name: str) -> Any:
    if name in params:
        return params[name]
    parameter = signature.get(name)
    return None if parameter is None else parameter.default


def check_strength(pipeline: type, signature: Mapping[str, inspect.Parameter], steps: int | None,
                   params: Mapping[str, Any], names: Mapping[str, str]) -> None:
    """Refuse a strength outside [0, 1], and a step count and strength that run no step, naming the fix."""
    strength = _value(params, signature, "strength")
    if "strength" not in signature or isinstance(strength, bool) or not isinstance(strength, int | float):
        return
    if not 0 <= strength <= 1:
        raise ConfigError(f"{names['param']} strength={strength:g}: must be between 0 and 1 (the share of the "
                          "schedule that runs from the image)")
    if _value(params, signature, "denoising_start") is not None:
        return
    rounding = _rounding(pipeline)
    steps = steps if steps is not None else _value(params, signature, "num_inference_steps")
    if rounding is None or isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        return
    if steps_run(rounding, steps, strength) >= 1:
        return
    if strength == 0:
        raise ConfigError(f"{names['param']} strength=0: {pipeline.__name__} would run no denoising step "
                          "(strength is the share of the steps that run)")
    least = next(n for n in range(steps + 1, steps + math.ceil(1 / strength) + 2)
                 if steps_run(rounding, n, strength) >= 1)
    raise ConfigError(f"{names['steps']} {steps} at strength {strength:g}: {pipeline.__name__} would run no "
                      f"denoising step (it runs int(steps × strength)); ask for at least {least} steps or a "
                      "higher strength")
