"""DiT block lists from tensor names, ordered as the model executes them.

A block list is a top-level attribute whose tensors are named `ATTR.<i>.<rest>` with indices
0..n-1, n >= 2, where every entry repeats the structure of entry 0: at least half of the smaller
entry's `<rest>` names (with shapes) appear in both — the repeated transformer block (Flux
`transformer_blocks` and `single_transformer_blocks`, Wan `blocks`). Variants of one block type
stay in the list (SD3's last block is `context_pre_only` and has fewer tensors).
Nested lists (`context_embedder.token_refiner.refiner_blocks.0`) belong to non-block modules.

Execution order: the order the model class registers those attributes (its `__init__` order,
which is the order its forward runs them in every diffusers DiT), read from a meta-device
instance built from the config — no weights are touched. When the class cannot be built that
way, a fallback order of known names applies, then alphabetical.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from .weights import TensorInfo

_INDEXED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\.(\d+)\.(.+)$")
FALLBACK_ORDER = (
    "double_blocks", "transformer_blocks", "joint_blocks", "blocks", "layers",
    "single_transformer_blocks", "single_blocks",
)


@dataclass(frozen=True, slots=True)
class BlockList:
    """One list of repeated DiT blocks."""

    attr: str
    block_bytes: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.block_bytes)

    @property
    def total_bytes(self) -> int:
        return sum(self.block_bytes)

    @property
    def largest_bytes(self) -> int:
        return max(self.block_bytes)


def find_block_lists(tensors: Iterable[TensorInfo]) -> list[BlockList]:
    """Block lists in tensor-name (alphabetical) order; see `order_block_lists` for execution order."""
    members: dict[str, dict[int, dict[str, TensorInfo]]] = defaultdict(lambda: defaultdict(dict))
    for tensor in tensors:
        match = _INDEXED.match(tensor.name)
        if match:
            attr, index, rest = match.groups()
            members[attr][int(index)][rest] = tensor
    lists = []
    for attr, entries in sorted(members.items()):
        n = len(entries)
        if n < 2 or sorted(entries) != list(range(n)):
            continue
        if not all(_repeats(entries[0], entries[i]) for i in range(1, n)):
            continue  # not a repeated structure: a list of heterogeneous modules
        lists.append(BlockList(attr, tuple(sum(t.nbytes for t in entries[i].values()) for i in range(n))))
    return lists


def _repeats(first: dict[str, TensorInfo], other: dict[str, TensorInfo]) -> bool:
    a = {(r, t.shape) for r, t in first.items()}
    b = {(r, t.shape) for r, t in other.items()}
    return len(a & b) * 2 >= min(len(a), len(b))


def registration_order(library: str | None, class_name: str | None, config: dict) -> list[str] | None:
    """Top-level child names of the model class in registration order, or None if it cannot be built."""
    if library != "diffusers" or not class_name:
        return None
    try:
        import diffusers
        import torch

        cls = getattr(diffusers, class_name, None)
        if cls is None or not hasattr(cls, "from_config"):
            return None
        with torch.device("meta"):
            model = cls.from_config({k: v for k, v in config.items() if not k.startswith("_")})
        return [name for name, _ in model.named_children()]
    except Exception:  # any failure falls back to the documented name order
        return None


def order_block_lists(lists: list[BlockList], order: list[str] | None) -> list[BlockList]:
    """Sort block lists into execution order (registration order, else FALLBACK_ORDER)."""
    def key(block_list: BlockList) -> tuple[int, int, str]:
        if order and block_list.attr in order:
            return (0, order.index(block_list.attr), block_list.attr)
        if block_list.attr in FALLBACK_ORDER:
            return (1, FALLBACK_ORDER.index(block_list.attr), block_list.attr)
        return (2, 0, block_list.attr)

    return sorted(lists, key=key)
