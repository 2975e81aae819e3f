"""`--lora PATH[:SCALE]` (repeatable) and `--lora-mode`: parsed here (torch-free), checked by the engine.

The file is read only when the engine opens the model (engine/loading/lora_files.py: safetensors only,
diffusers' own key conversion, keys and shapes against the model), so a bad LoRA is one line and exit 2
before anything loads.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from .flag_types import path_name, shown

LORA_MODES = ("sidecar", "merge", "auto")
MAX_SCALE = 100.0  # far past any useful strength; bounds what a typo costs


def lora_spec(text: str) -> tuple[str, float]:
    """`PATH` or `PATH:SCALE` (scale 1.0 by default): the path as the operator named it, and a finite scale."""
    path, sep, tail = text.rpartition(":")
    scale = 1.0
    if sep:
        try:
            scale = float(tail)
        except ValueError:
            path = text  # a ':' inside the path, no scale
        else:
            if not math.isfinite(scale) or abs(scale) > MAX_SCALE:
                raise argparse.ArgumentTypeError(f"scale {shown(tail)}: must be a finite number within "
                                                 f"±{MAX_SCALE:g}")
    else:
        path = text
    return str(path_name(path)), scale


def add_lora_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lora", type=lora_spec, action="append", default=[], metavar="PATH[:SCALE]",
                        help="a LoRA (.safetensors, kohya or diffusers/PEFT keys) applied at SCALE (default 1); "
                             "repeatable")
    parser.add_argument("--lora-mode", choices=LORA_MODES, default="auto",
                        help="sidecar: A/B kept on the device and applied in the forward; merge: added into each "
                             "block's slot as it arrives; auto (default): merge")


def lora_options(args: argparse.Namespace) -> dict[str, Any]:
    """The `EngineOptions` fields the flags set."""
    return {"loras": tuple(getattr(args, "lora", ()) or ()), "lora_mode": getattr(args, "lora_mode", "auto")}


def _mode_words(mode: str) -> str:
    if mode == "sidecar":
        return "sidecar: A/B kept on the device beside the blocks, applied in each forward"
    how = "merge" if mode == "merge" else "auto (merge)"
    return f"{how}: B·A added into each streamed block's slot as it arrives; resident modules merged once at load"


def lora_documents(loras: list[Any], mode: str) -> list[dict[str, Any]]:
    """`plan --json`'s `loras`: each checked file, its bytes, scale, the components it applies to and the mode."""
    return [{"path": str(f.path), "bytes": f.nbytes, "scale": f.scale, "components": list(f.components),
             "mode": mode} for f in loras]


def lora_lines(loras: list[Any], mode: str) -> list[str]:
    """The plan's LoRA lines (none without --lora): each file's bytes, scale and components, then the mode."""
    from ..engine.api import plain
    from ..offload.units import format_bytes

    if not loras:
        return []
    lines = [f"LoRA {plain(f.name)}: {format_bytes(f.nbytes)} at scale {f.scale:g} on {', '.join(f.components)}"
             for f in loras]
    total = sum(f.nbytes for f in loras)
    lines.append(f"LoRA mode {_mode_words(mode)} ({format_bytes(total)} of A/B on the device)")
    lines.append("LoRA in the vLLM-Omni export: not expressed (the flags above name no LoRA; this export knows no "
                 "vLLM-Omni LoRA flag)")
    return lines
