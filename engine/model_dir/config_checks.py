"""What a config file in a model directory may say: no code references of its own.

The libraries pick classes from config keys: `auto_map` points at a `.py` file shipped with the
model (run only under `trust_remote_code=True`), and `tokenizer_class`, `processor_class`,
`image_processor_type`, `feature_extractor_type`, `video_processor_type` (transformers) and
`_class_name` (diffusers) name the class to build. The engine never trusts remote code, but a
directory that asks for it is refused at discovery, so `plan` says so before anything loads:
- `auto_map` anywhere in a config document (also nested, e.g. inside `tokenizer_config`);
- a transformers class key naming a class the installed transformers does not define (or, in the folder of
  a component that one of diffusers' pipeline packages defines, that package: Kolors' tokenizer config names
  `ChatGLMTokenizer`, the class of its `["kolors", "ChatGLMTokenizer"]`);
- a diffusers `_class_name` naming a class the installed diffusers does not define (or, in the folder
  of a component that one of diffusers' pipeline packages defines, that package: LTX-2's
  `["ltx2", "LTX2TextConnectors"]` saves `"_class_name": "LTX2TextConnectors"`).

Config values can also name files: older transformers releases open a tokenizer's `vocab_file`,
`merges_file`, `tokenizer_file`, … as written in `tokenizer_config.json`. A `*_file` value that
points at an existing file outside the model directory is refused (a creator's stale absolute path
to a file that does not exist here is harmless and allowed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ModelDirError
from .class_index import find_pipeline_package_class
from .safe_paths import is_inside
from .trusted_classes import library_defines

TRANSFORMERS_CLASS_KEYS = ("tokenizer_class", "processor_class", "image_processor_type", "feature_extractor_type",
                           "video_processor_type")
_NO_CODE = "custom code is never run"


def is_config_file(name: str) -> bool:
    """config.json, tokenizer_config.json, scheduler_config.json, preprocessor_config.json, … (not shard indexes)."""
    return name.endswith("config.json")


def check_config_document(path: Path, document: dict[str, Any], *, top_class_name: bool = True,
                          roots: tuple[Path, ...] | None = None, package: str | None = None) -> None:
    """Refuse a config that references code or outside files (rules in the module docstring).

    `path` names the file in the message. `top_class_name=False` skips the top-level `_class_name`
    (model_index.json's is the pipeline, checked as such by `trusted_classes.pipeline_class`).
    `roots` (see `safe_paths.allowed_roots`) enables the `*_file` check. `package`: the diffusers
    pipeline package whose class the component is, whose classes its `_class_name` may name too.
    """
    if top_class_name and "_class_name" in document:
        value = document["_class_name"]
        if not (library_defines("diffusers", value) or _package_defines(package, value)):
            raise ModelDirError(f"{path}: '_class_name' {value!r:.60} is not a diffusers class ({_NO_CODE})")
    pending: list[tuple[str, Any]] = [("", document)]
    while pending:  # iterative: a deep document cannot exhaust the stack here
        where, value = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                key_path = f"{where}.{key}" if where else key
                if key == "auto_map":
                    raise ModelDirError(f"{path}: '{key_path}' names code shipped with the model ({_NO_CODE})")
                if key in TRANSFORMERS_CLASS_KEYS and item is not None and not (
                        library_defines("transformers", item) or _package_defines(package, item, ("loadable",))):
                    raise ModelDirError(f"{path}: '{key_path}' {item!r:.60} is not a transformers class ({_NO_CODE})")
                if roots is not None and isinstance(key, str) and key.endswith("_file") and isinstance(item, str):
                    _check_file_value(path, key_path, item, roots)
                pending.append((key_path, item))
        elif isinstance(value, list):
            pending.extend((f"{where}[{i}]", item) for i, item in enumerate(value))


def _package_defines(package: str | None, name: object, kinds: tuple[str, ...] | None = None) -> bool:
    """Whether the pipeline package defines class `name` (of one of `kinds`: a tokenizer is "loadable")."""
    if package is None or not isinstance(name, str):
        return False
    ref = find_pipeline_package_class(package, name)
    return ref is not None and (kinds is None or ref.kind in kinds)


def _check_file_value(path: Path, key_path: str, value: str, roots: tuple[Path, ...]) -> None:
    if not value or "\0" in value:
        return
    target = path.parent / value  # an absolute value replaces the folder, as the libraries would
    try:
        exists = target.exists() or target.is_symlink()
    except (OSError, ValueError):
        return
    if exists and not is_inside(target, roots):
        raise ModelDirError(f"{path}: '{key_path}' names {value!r:.80}, a file outside the model directory "
                            "(files outside it are never opened)")
