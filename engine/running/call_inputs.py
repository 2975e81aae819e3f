"""Inputs a pipeline call needs, and numbers it must never get — checked before load.

- A pipeline whose `__call__` has a parameter without a default (WanAnimate: `pose_video`,
  `face_video`) fails only after every weight has loaded when the request leaves it out: refused,
  naming each one and how (or that it cannot) be given here.
- A non-finite number (NaN, infinity) anywhere in a `--param` value (`sigmas=[NaN]`) makes a black
  image with exit 0: refused, naming the parameter.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError


def _has_non_finite(value: Any, depth: int = 0) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if depth > 64:  # deeper than any parameter takes: refused elsewhere, not walked
        return False
    if isinstance(value, list | tuple):
        return any(_has_non_finite(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return any(_has_non_finite(item, depth + 1) for item in value.values())
    return False


def check_finite(params: Mapping[str, Any], label: str) -> None:
    """Refuse a parameter holding NaN or infinity, at any depth."""
    for key, value in params.items():
        if _has_non_finite(value):
            raise ConfigError(f"{label} {key}: holds a non-finite number (NaN or infinity); give finite numbers")


def _passable(parameter: inspect.Parameter) -> bool:
    """Whether a `--param` JSON value can be what the parameter takes (a video or a PIL image cannot)."""
    annotation = parameter.annotation
    if annotation is inspect.Parameter.empty:
        return True
    text = str(annotation)
    return not any(word in text for word in ("Image", "Tensor", "ndarray", "PipelineImageInput"))


def check_required_inputs(pipeline: str, signature: Mapping[str, inspect.Parameter], given: set[str],
                          names: Mapping[str, str]) -> None:
    """Refuse a request that leaves out a parameter the pipeline's call has no default for.

    `given`: the pipeline keywords the request sets (its options and params)."""
    missing = [name for name, p in signature.items()
               if p.default is inspect.Parameter.empty and name not in given and name != "prompt"]
    if not missing:
        return
    hints = []
    for name in missing:
        if name == "image":
            hints.append(f"{name} (pass {names['image']} FILE)")
        elif _passable(signature[name]):
            hints.append(f"{name} (pass {names['param']} {name}=VALUE)")
        else:
            hints.append(f"{name} (cannot be given here)")
    tail = "; not supported here" if any("cannot" in hint for hint in hints) else ""
    raise ConfigError(f"{pipeline} needs {', '.join(hints)}: its call has no default for "
                      f"{'them' if len(missing) > 1 else 'it'}{tail}")
