"""`--param KEY=VALUE` as text: its syntax and its numbers, without torch or diffusers.

`run` answers a mistake the flags alone decide before the heavy imports (console/run_flags.py), so
these checks live apart from the call's checks against the pipeline (`call_options`), which import it.
A non-finite number (NaN, infinity) anywhere in a value (`sigmas=[NaN]`) would make a black image with
exit 0: refused, naming the parameter.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError

# Parameters the engine sets itself: a --param may not replace them (`call_options` refuses them).
ENGINE_PARAMETERS = frozenset({"prompt", "generator", "output_type", "return_dict", "callback_on_step_end",
                               "callback_on_step_end_tensor_inputs", "callback", "callback_steps"})
# Pipeline parameters a flag of its own sets -> (that flag's request field, what it is): `call_options`
# refuses them as a --param with the same line (a test holds the two tables equal).
DEDICATED_PARAMETERS: dict[str, tuple[str, str]] = {
    "num_inference_steps": ("steps", "number of steps"), "height": ("height", "height"),
    "width": ("width", "width"), "guidance_scale": ("guidance", "guidance scale"),
    **{name: ("frames", "number of frames") for name in ("num_frames", "video_length", "frames")},
    "negative_prompt": ("negative_prompt", "negative prompt"),
    "max_sequence_length": ("max_sequence_length", "max sequence length"), "image": ("image", "conditioning image"),
}


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


def unknown_parameter_line(pipeline_class: str, key: str, parameters: frozenset[str], label: str) -> str:
    """`call_options`' line for a `--param` the pipeline's call does not have, with a "did you mean"."""
    close = difflib.get_close_matches(key, sorted(p for p in parameters if p not in ENGINE_PARAMETERS), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{label} {key}: {pipeline_class} has no parameter {key}{hint}"


def check_parameter_names(model_path: Path, params: Mapping[str, Any], label: str) -> None:
    """Before the heavy imports: a `--param` key the pipeline's `__call__` does not have (a typo), read from
    `model_index.json`'s class and the installed diffusers source, with the line `call_options` gives after
    the import. Whatever cannot be read here (no index, an unknown class) is left to discovery and
    `call_options`, which say what is wrong."""
    from ..model_dir.weights import load_json
    from ..planning.model_configs import call_parameter_names

    keys = [key for key in params if key not in ENGINE_PARAMETERS]
    index = model_path / "model_index.json"
    try:
        if not keys or not index.is_file():
            return
        name = load_json(index).get("_class_name")
    except Exception:  # discovery reads it again and says why
        return
    parameters = call_parameter_names(name) if isinstance(name, str) else None
    if parameters is None:
        return
    for key in keys:
        if key not in parameters:
            raise ConfigError(unknown_parameter_line(name, key, parameters, label))
        if key in DEDICATED_PARAMETERS:
            option, noun = DEDICATED_PARAMETERS[key]
            raise ConfigError(f"{label} {key}: use --{option.replace('_', '-')} for {noun}")
