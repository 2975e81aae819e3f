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
                             "block's slot as it arrives; auto (default): the mode with the smaller forecast step")


def lora_options(args: argparse.Namespace) -> dict[str, Any]:
    """The `EngineOptions` fields the flags set."""
    return {"loras": tuple(getattr(args, "lora", ()) or ()), "lora_mode": getattr(args, "lora_mode", "auto")}


def _mode_words(mode: str, chosen: str) -> str:
    how = chosen if mode != "auto" else f"auto ({chosen})"
    if chosen == "sidecar":
        return f"{how}: A/B kept on the device beside the blocks, applied in each forward"
    return f"{how}: B·A added into each streamed block's slot as it arrives; resident modules merged once at load"


def _per_step(seconds: float | None, flops: float | None) -> str:
    if flops is None:
        return "unknown (the request's tokens are not known)"
    work = f"{flops / 1e9:.3g} GFLOP" if flops >= 1e8 else f"{flops / 1e6:.3g} MFLOP"
    return f"{seconds * 1e3:.3g} ms ({work})" if seconds is not None else work


def lora_lines(loras: list[Any], mode: str, modes: Any = None) -> list[str]:
    """The plan's LoRA lines (none without --lora): each file's bytes, scale and components, the mode with its
    device bytes, each mode's extra work per step, and vLLM-Omni's spelling or what it cannot express."""
    from ..engine.api import plain, planner
    from ..offload.units import format_bytes

    if not loras:
        return []
    lines = [f"LoRA {plain(f.name)}: {format_bytes(f.nbytes)} at scale {f.scale:g} on {', '.join(f.components)}"
             for f in loras]
    chosen = modes.chosen if modes is not None else ("merge" if mode == "auto" else mode)
    if modes is None:
        lines.append(f"LoRA mode {_mode_words(mode, chosen)}")
    else:
        scratch = f" + {format_bytes(modes.merge_scratch_bytes)} B·A scratch" if chosen == "merge" else ""
        lines.append(f"LoRA mode {_mode_words(mode, chosen)} ({format_bytes(modes.ab_bytes)} of A/B{scratch} on "
                     "the device, in the forecast)")
        lines.append(f"LoRA cost per step: sidecar {_per_step(modes.sidecar_s, modes.sidecar_flops)}, merge "
                     f"{_per_step(modes.merge_s, modes.merge_flops)}; {plain(modes.why)}")
    text, gaps = planner.vllm_lora(loras, chosen)
    lines.append(f"LoRA in the vLLM-Omni export: {plain(text)}")
    lines += [f"  cannot express: {plain(gap)}" for gap in gaps]
    return lines
