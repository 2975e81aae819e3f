"""The text length a pipeline's DiT takes exactly, and the one refusal of any other: shared by `run`
(`call_options.check_call`, with the call signature's default) and `plan` (with the default read from
the installed source, `model_configs.default_size`), so both refuse the same request with the same
line. Torch-free: `plan` imports it without torch or diffusers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..model_dir.discovery import ModelInfo
from ..model_dir.weights import load_json

COGVIDEOX_TEXT = 226  # CogVideoXTransformer3DModel's own default max_text_seq_length


def dit_config(model: ModelInfo) -> dict[str, Any]:
    """The first DiT's config.json ({} without one)."""
    dits = model.dits
    path: Path | None = dits[0].folder / "config.json" if dits else None
    return load_json(path) if path is not None and path.is_file() else {}


def fixed_text_length(model: ModelInfo) -> int | None:
    """The text length a pipeline's DiT takes exactly, where it has one (None: any).

    CogVideoX models with absolute position embeddings (sin-cos, or learned) add one embedding table over
    text + video tokens, sized by the transformer's `max_text_seq_length`: a prompt encoded to any other
    length fails in the first DiT forward ("The size of tensor a (274) must match the size of tensor b")."""
    if not model.pipeline_class.startswith("CogVideoX"):
        return None
    config = dit_config(model)
    if config.get("use_rotary_positional_embeddings") and not config.get("use_learned_positional_embeddings"):
        return None
    value = config.get("max_text_seq_length")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else COGVIDEOX_TEXT


def check_text_length(model: ModelInfo, asked: int | None, default: object, label: str) -> None:
    """Refuse (ConfigError, one line) a text length the DiT cannot take: `asked` (the flag's), else the
    pipeline's `default`."""
    required = fixed_text_length(model)
    if required is None:
        return
    effective = asked if asked is not None else default
    if effective != required:
        given = f"{label} {asked}" if asked is not None else f"{label}: the pipeline's default {effective}"
        raise ConfigError(f"{given} does not fit: {model.pipeline_class}'s transformer takes text of exactly "
                          f"{required} tokens (max_text_seq_length); pass {label} {required}")
