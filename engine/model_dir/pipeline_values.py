"""Pipeline-level values of `model_index.json`, passed to the pipeline exactly as diffusers passes them.

Besides `[library, class]` component pairs, a saved pipeline's `model_index.json` holds the values its
`__init__` registered with `register_to_config` (`boundary_ratio` and `expand_timesteps` for Wan 2.2,
`requires_safety_checker` for SD, `force_zeros_for_empty_prompt`, ...). Dropping them silently changes
the pipeline (Wan 2.2 A14B never ran its second expert). `DiffusionPipeline.from_pretrained` passes
each value its `__init__` takes as an optional keyword (`extract_init_dict`, then the optional
parameters that are not optional *components*), and `None` for an optional component saved as
`[null, null]`; `init_values` and `absent_components` do the same with diffusers' own functions.

The values come from an untrusted file, so discovery keeps only plain JSON scalars, short lists of them and
small objects of those (Marigold intrinsics' `target_properties`: names to dicts of a space and sub-targets),
nested at most three deep (`check_value`), and the loader refuses a value whose type the `__init__` annotation rules out
(a string for a `float | None`), both as one line (exit 2) before any weight is read.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from ..errors import ModelDirError

MAX_STRING = 256
MAX_LIST = 64
MAX_DEPTH = 3  # containers within containers: Marigold's {"material": {"sub_target_names": [..]}} is three
MAX_INT = 2**53  # every integer a float holds exactly: a pipeline multiplies these by floats (Wan's boundary_ratio)

_SCALARS = (bool, int, float, str, type(None))


def is_component_entry(value: object) -> bool:
    """Shaped like a component: a list of strings, or a pair holding a string or null (`[null, null]` is a
    component left out). Discovery refuses such an entry unless it is a `[library, class]` pair of strings;
    a pipeline value is never one (numbers, booleans, a string, null, or a list of numbers)."""
    if not isinstance(value, list) or not value:
        return False
    return all(isinstance(v, str) for v in value) or (
        len(value) == 2 and any(v is None or isinstance(v, str) for v in value))


def check_value(key: str, value: object, where: str, depth: int = 0) -> object:
    """A plain JSON scalar (finite numbers, short strings), or a short list or small object of them nested at
    most MAX_DEPTH deep; else one line."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ModelDirError(f"{where}: pipeline value {key!r:.60} must be a finite number, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        digits = len(str(abs(value)))
        raise ModelDirError(f"{where}: pipeline value {key!r:.60} is an integer of {digits} digits (at most "
                            f"{MAX_INT:,}; refused before load)")
    if isinstance(value, str) and len(value) > MAX_STRING:
        raise ModelDirError(f"{where}: pipeline value {key!r:.60} is a string of {len(value)} characters "
                            f"(at most {MAX_STRING})")
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, list) and depth < MAX_DEPTH:
        if len(value) > MAX_LIST:
            raise ModelDirError(f"{where}: pipeline value {key!r:.60} is a list of {len(value)} items "
                                f"(at most {MAX_LIST})")
        return [check_value(key, item, where, depth + 1) for item in value]
    if isinstance(value, dict) and depth < MAX_DEPTH:
        if len(value) > MAX_LIST:
            raise ModelDirError(f"{where}: pipeline value {key!r:.60} is an object of {len(value)} entries "
                                f"(at most {MAX_LIST})")
        return {check_value(key, name, where, MAX_DEPTH): check_value(key, item, where, depth + 1)
                for name, item in value.items()}
    kind = f"containers nested more than {MAX_DEPTH} deep" if isinstance(value, list | dict) else \
        f"a JSON {type(value).__name__}"
    raise ModelDirError(f"{where}: pipeline value {key!r:.60} must be a number, string, boolean, null, or lists and "
                        f"objects of them, got {kind}")


def pipeline_values(index: Mapping[str, Any], where: str) -> dict[str, object]:
    """Every non-private entry of `model_index.json` that is not a component pair, checked.

    Keys listed in `_use_default_values` are dropped, as diffusers' `extract_init_dict` drops them."""
    defaults = index.get("_use_default_values", [])
    if not isinstance(defaults, list) or not all(isinstance(k, str) for k in defaults):
        raise ModelDirError(f"{where}: '_use_default_values' must be a list of names")
    return {key: check_value(key, value, where) for key, value in index.items()
            if not key.startswith("_") and key not in defaults and not is_component_entry(value)}


def init_values(cls: type, values: Mapping[str, object], where: str) -> dict[str, object]:
    """The keyword values `DiffusionPipeline.from_pretrained` passes to `cls.__init__`, type-checked."""
    from diffusers import DiffusionPipeline

    init_dict, _, _ = cls.extract_init_dict({"_class_name": cls.__name__, **values})
    _, optional = DiffusionPipeline._get_signature_keys(cls)
    passed = {k: init_dict[k] for k in optional if k in init_dict and k not in cls._optional_components}
    parameters = inspect.signature(cls.__init__).parameters
    for key, value in passed.items():
        allowed = _annotation_types(parameters[key].annotation)
        if allowed is not None and not _matches(value, allowed):
            names = " | ".join(sorted(t.__name__ if t is not type(None) else "None" for t in allowed))
            raise ModelDirError(f"{where}: pipeline value {key!r:.60} must be {names} for {cls.__name__}, "
                                f"got {value!r:.60}")
    return passed


def absent_components(cls: type, present: set[str], where: str) -> dict[str, None]:
    """`None` for each component `__init__` expects that the directory left out (`[null, null]` or missing),
    allowed only for the pipeline's optional components, as in `from_pretrained`."""
    from diffusers import DiffusionPipeline

    expected, _ = DiffusionPipeline._get_signature_keys(cls)
    missing = sorted(set(expected) - present)
    required = [name for name in missing if name not in cls._optional_components]
    if required:
        raise ModelDirError(f"{where}: {cls.__name__} needs {', '.join(required)}, which the directory does not "
                            "provide")
    return dict.fromkeys(missing)


def _annotation_types(annotation: object) -> set[type] | None:
    """The plain types an annotation allows (`float | None` -> {float, NoneType}); None when it is not plain."""
    if annotation is inspect.Parameter.empty:
        return None
    if annotation is None:
        return {type(None)}
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [_annotation_types(arg) for arg in typing.get_args(annotation)]
        return None if any(p is None for p in parts) else set().union(*parts)
    if origin in (list, tuple):
        return {origin}
    if annotation in _SCALARS or annotation in (list, tuple):
        return {annotation}  # type: ignore[arg-type]
    return None


def _matches(value: object, allowed: set[type]) -> bool:
    if isinstance(value, bool):
        return bool in allowed
    if isinstance(value, int):
        return bool({int, float} & allowed)
    if isinstance(value, list):
        return bool({list, tuple} & allowed)
    return type(value) in allowed
