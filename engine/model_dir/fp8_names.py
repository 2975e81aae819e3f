"""fp8 storage by name, torch-free: the dtypes and what the plan says of them (`plan` imports no torch)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

FP8_NAMES: tuple[str, ...] = ("float8_e4m3fn", "float8_e5m2")

SKIP_PATTERNS: tuple[str, ...] = ("pos_embed", "patch_embed", "norm", "^proj_in$", "^proj_out$")
"""diffusers' layerwise-casting default skip patterns (`DEFAULT_SKIP_MODULES_PATTERN`), for forecasts made
without importing diffusers; once it is imported, its own list is read (a test checks they agree)."""


def _skip_patterns() -> tuple[str, ...]:
    loaded = sys.modules.get("diffusers.hooks.layerwise_casting")
    return tuple(getattr(loaded, "DEFAULT_SKIP_MODULES_PATTERN", SKIP_PATTERNS))

DEMO_DIFFERENCE: dict[str, tuple[float, int]] = {"float8_e4m3fn": (0.55, 6), "float8_e5m2": (1.09, 10)}


def storage_note(stream_dtype: str | None, modulation: bool, kind: str = "DiT") -> str | None:
    """What the plan says about fp8 storage: what is stored how, and that the outputs change (`kind`: the
    streamed blocks' name, "DiT" or "UNet")."""
    if stream_dtype is None:
        return None
    mean, top = DEMO_DIFFERENCE[stream_dtype]
    rule = ("diffusers' layerwise-casting rule plus the AdaLN modulation linears (not diffusers' rule)"
            if modulation else "diffusers' layerwise-casting rule: norms, embeddings, pos/patch embeds, "
            "proj_in/proj_out and modulation linears keep the compute dtype")
    return (f"{kind} weights stored in {stream_dtype} ({rule}), upcast per block on the device: outputs differ "
            f"from the full-precision pipeline (demo model: mean |Δ| {mean:.2f}, max {top} of 255 per pixel "
            f"value) and match diffusers' enable_layerwise_casting bit for bit")


def header_stored_fp8(names: Iterable[tuple[str, tuple[int, ...]]], *, modulation: bool = False) -> set[str]:
    """Tensor names (relative to the DiT) the rule would store in fp8, judged from names and shapes
    alone: a layer is a module with a weight of two or more dimensions (Linear, Conv, Embedding), skipped
    by the default patterns; `modulation` keeps the `norm*.linear` layers too. A forecast: the load
    applies the exact rule to the built model."""
    shapes = dict(names)
    layers = {n.rpartition(".")[0] for n, s in shapes.items() if n.endswith(".weight") and len(s) >= 2}
    patterns = _skip_patterns()
    out: set[str] = set()
    for name in shapes:
        module, _, leaf = name.rpartition(".")
        if module not in layers or leaf not in ("weight", "bias"):
            continue
        skipped = any(re.search(p, module) for p in patterns)
        if skipped and not (modulation and re.search(r"norm[^.]*\.linear$", module)):
            continue
        out.add(name)
    return out


def fp8_block_bytes(attr: str, index: int, entries: dict, modulation: bool = False) -> int:
    """A block's bytes with fp8 storage, from its header entries (`rest` name -> `TensorInfo`)."""
    prefix = f"{attr}.{index}."
    chosen = header_stored_fp8(((prefix + rest, t.shape) for rest, t in entries.items()), modulation=modulation)
    return sum(t.numel if prefix + rest in chosen else t.nbytes for rest, t in entries.items())


def fp8_block_elements(attr: str, index: int, entries: dict, modulation: bool = False) -> int:
    """How many of a block's elements are stored in fp8 (each upcast once per forward: offload/upcast.py): the
    rule's choice, and whatever the checkpoint already holds in fp8."""
    prefix = f"{attr}.{index}."
    chosen = header_stored_fp8(((prefix + rest, t.shape) for rest, t in entries.items()), modulation=modulation)
    return sum(t.numel for rest, t in entries.items() if prefix + rest in chosen or t.dtype in FP8_NAMES)
