"""`--param KEY=VALUE` as text: its syntax and its numbers, without torch or diffusers.

`run` answers a mistake the flags alone decide before the heavy imports (console/run_flags.py), so
these checks live apart from the call's checks against the pipeline (`call_options`), which import it.
A non-finite number (NaN, infinity) anywhere in a value (`sigmas=[NaN]`) would make a black image with
exit 0: refused, naming the parameter.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError


def parse_param(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` -> (key, value): the value as JSON when it parses (numbers, true/false, null, lists),
    else the string itself."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"{text!r:.80}: expected KEY=VALUE")
    if not key.isidentifier():
        raise ConfigError(f"{key!r:.80}: a parameter name is a Python identifier (e.g. num_frames)")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return key, raw
    if isinstance(value, float) and not math.isfinite(value):
        return key, raw
    return key, value


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
