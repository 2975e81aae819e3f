"""What a config file in a model directory may say: no code references of its own.

The libraries pick classes from config keys: `auto_map` points at a `.py` file shipped with the
model (run only under `trust_remote_code=True`), and `tokenizer_class`, `processor_class`,
`image_processor_type`, `feature_extractor_type`, `video_processor_type` (transformers) and
`_class_name` (diffusers) name the class to build. The engine never trusts remote code, but a
directory that asks for it is refused at discovery, so `plan` says so before anything loads:
- `auto_map` anywhere in a config document (also nested, e.g. inside `tokenizer_config`);
- a transformers class key naming a class the installed transformers does not define;
- a diffusers `_class_name` naming a class the installed diffusers does not define.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ModelDirError
from .trusted_classes import library_defines

TRANSFORMERS_CLASS_KEYS = ("tokenizer_class", "processor_class", "image_processor_type", "feature_extractor_type",
                           "video_processor_type")
_NO_CODE = "custom code is never run"


def is_config_file(name: str) -> bool:
    """config.json, tokenizer_config.json, scheduler_config.json, preprocessor_config.json, … (not shard indexes)."""
    return name.endswith("config.json")


def check_config_document(path: Path, document: dict[str, Any], *, top_class_name: bool = True) -> None:
    """Refuse a config that references code (rules in the module docstring); `path` names it in the message.

    `top_class_name=False` skips the top-level `_class_name` (model_index.json's is the pipeline,
    checked as such by `trusted_classes.pipeline_class`).
    """
    if top_class_name and "_class_name" in document:
        value = document["_class_name"]
        if not library_defines("diffusers", value):
            raise ModelDirError(f"{path}: '_class_name' {value!r:.60} is not a diffusers class ({_NO_CODE})")
    pending: list[tuple[str, Any]] = [("", document)]
    while pending:  # iterative: a deep document cannot exhaust the stack here
        where, value = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                key_path = f"{where}.{key}" if where else key
                if key == "auto_map":
                    raise ModelDirError(f"{path}: '{key_path}' names code shipped with the model ({_NO_CODE})")
                if key in TRANSFORMERS_CLASS_KEYS and item is not None and not library_defines("transformers", item):
                    raise ModelDirError(f"{path}: '{key_path}' {item!r:.60} is not a transformers class ({_NO_CODE})")
                pending.append((key_path, item))
        elif isinstance(value, list):
            pending.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
