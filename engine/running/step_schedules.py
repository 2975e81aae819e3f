"""Per-step schedules a pipeline's call defaults to, checked against the request's step count before load.

Ideogram 4's call defaults `guidance_schedule` to 48 values, one per default step, and refuses (after every
weight has loaded) any other step count unless it is given a schedule of that length or a constant
`guidance_scale` with the schedule set to None. `--guidance G` is that constant scale: the request then passes
`guidance_schedule=None` (`runner.GenerateRequest.call_kwargs`), as the pipeline's docstring says to.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError

GUIDANCE_SCHEDULE = "guidance_schedule"


def _schedules(signature: Mapping[str, inspect.Parameter]) -> dict[str, tuple[Any, ...] | list[Any]]:
    """Parameters named `*_schedule` whose default is a list of values, one per step."""
    return {name: p.default for name, p in signature.items()
            if name.endswith("_schedule") and isinstance(p.default, tuple | list) and p.default}


def check_step_schedules(pipeline: str, signature: Mapping[str, inspect.Parameter], steps: int | None,
                         guidance: float | None, params: Mapping[str, Any], names: Mapping[str, str]) -> None:
    """Refuse a step count a per-step schedule the request leaves at its default (or gives) does not match."""
    schedules = _schedules(signature)
    if not schedules:
        return
    default_steps = signature.get("num_inference_steps")
    count = steps if steps is not None else getattr(default_steps, "default", None)
    if not isinstance(count, int) or isinstance(count, bool):
        return
    for name, default in schedules.items():
        if name == GUIDANCE_SCHEDULE and guidance is not None and name not in params:
            continue  # a constant scale replaces it
        value = params.get(name, default)
        if value is None or not isinstance(value, tuple | list) or len(value) == count:
            continue
        given = name in params
        fix = (f"give {len(value)} steps" if given else
               f"ask for {len(value)} steps, give {names['param']} {name}=[...] with {count} values"
               + (f", or a constant {names['guidance']}" if name == GUIDANCE_SCHEDULE else ""))
        what = f"{names['param']} {name} has" if given else f"{pipeline}'s default {name} has"
        raise ConfigError(f"{names['steps']} {count}: {what} {len(value)} values, one per step ({fix})")
