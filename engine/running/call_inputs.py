"""Inputs a pipeline call needs, and numbers it must never get — checked before load.

- A pipeline whose `__call__` has a parameter without a default (WanAnimate: `pose_video`,
  `face_video`) fails only after every weight has loaded when the request leaves it out: refused,
  naming each one and how (or that it cannot) be given here.
- A non-finite number in a `--param` value: `param_syntax.check_finite`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

from ..errors import ConfigError


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
