"""A text encoder's layer list, so that it can stream layer by layer like a DiT's blocks (engine/planning/lean.py).

From the headers (planning, no weights read): the tensors named `PREFIX.<i>.<rest>` with indices
0..n-1, n >= 2, each entry repeating entry 0's structure, where PREFIX is everything up to the first
index (T5/UMT5 `encoder.block`, CLIP `text_model.encoder.layers`, Llama/Gemma/Qwen `layers` or
`model.layers`). Of several such lists (Qwen2.5-VL's vision `visual.blocks` beside its language
`model.layers`), the one holding the most bytes: the stack a text prompt runs through.

From the built module (placement): the `ModuleList` at that path, or, where a library renames the
checkpoint's keys (transformers' key mappings), the `ModuleList` of that many entries holding the
most parameter bytes. Nothing found: the encoder is staged whole, never guessed.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from .blocks import BlockList
from .weights import TensorInfo

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")


def _split(name: str) -> tuple[str, int, str] | None:
    """(PREFIX, i, REST) of `PREFIX.<i>.REST`, cut at the first index; one pass over the name (a
    backtracking pattern would be quadratic in a hostile header's long names)."""
    parts = name.split(".")
    for k, part in enumerate(parts):
        if _INDEX.fullmatch(part):
            if k == 0 or k == len(parts) - 1 or not all(_IDENT.fullmatch(p) for p in parts[:k]):
                return None
            return ".".join(parts[:k]), int(part), ".".join(parts[k + 1:])
    return None


def find_layer_list(tensors: Iterable[TensorInfo]) -> BlockList | None:
    """The encoder's main layer list from its tensor names, or None (see the module docstring)."""
    members: dict[str, dict[int, dict[str, TensorInfo]]] = defaultdict(lambda: defaultdict(dict))
    for tensor in tensors:
        split = _split(tensor.name)
        if split:
            prefix, index, rest = split
            members[prefix][index][rest] = tensor
    best: BlockList | None = None
    for prefix, entries in sorted(members.items()):
        n = len(entries)
        if n < 2 or sorted(entries) != list(range(n)):
            continue
        first = {(r, t.shape) for r, t in entries[0].items()}
        if not all(len(first & {(r, t.shape) for r, t in entries[i].items()}) * 2 >= min(len(first), len(entries[i]))
                   for i in range(1, n)):
            continue
        found = BlockList(prefix, tuple(sum(t.nbytes for t in entries[i].values()) for i in range(n)))
        if best is None or found.total_bytes > best.total_bytes:
            best = found
    return best


def _param_bytes(module: Any) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def layer_modules(module: Any, layers: BlockList) -> list[Any] | None:
    """The built encoder's layers for `layers` (from the headers), or None when none match its count."""
    import torch

    try:
        found = module.get_submodule(layers.attr)
    except AttributeError:
        found = None
    if isinstance(found, torch.nn.ModuleList) and len(found) == layers.count:
        return list(found)
    lists = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == layers.count]
    if not lists:
        return None
    return list(max(lists, key=_param_bytes))
