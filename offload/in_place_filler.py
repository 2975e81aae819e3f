"""A ring's host side taken in place from the one host storage its blocks already live in.

A text encoder built over one host arena (engine/loading/arena_load.py) has every weight in that
arena, layer after layer. Streamed layer by layer (offload/layer_stage.py), its layers used to be
copied into the ring's own arena while the original stayed for the non-layer weights: the layers'
bytes were held twice (9.26 GB extra on a Flux-size T5 under an 8 GB plan). Here each layer's region
is its own byte range of that storage, so the ring copies straight from it and nothing is packed.

It applies when every block's tensors are dense views of one host storage, each block's byte range
holds little besides its own tensors (the arena lays a layer's tensors out back to back), no two
blocks' tensors overlap, and the storage is page-locked or the ring was not asked to pin. Otherwise
`InPlaceFiller.pack` packs a copy, as `HostCopyFiller` always does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from .block_packing import Binding, Block, unique_tensors
from .deferred_weights import DeferredWeights
from .devices import placeholder, rebind, storage_bytes, storage_key
from .pinned import ALIGNMENT, HostArena, align_up, is_dense
from .slot_filler import HostCopyFiller

SLACK = 1 << 20  # bytes of a block's range that may belong to no tensor of it (alignment gaps, a stray bias)


class SharedArena(HostArena):
    """Another owner's host bytes, seen as an arena: page-locked as they are, never registered or freed
    here (the owner counts them; `close` only drops this reference)."""

    def __init__(self, tensor: torch.Tensor) -> None:  # no buffer of its own: see HostArena.__init__
        self._nbytes = tensor.numel()
        self._tensor = tensor
        self._registered = []
        self._unpinned = []
        self._released = 0
        self._partial = False
        self._registry_lock = threading.Lock()
        self._pin_failure_reason = None
        self._shared_pinned = tensor.is_pinned()
        self.huge_pages = False

    @property
    def pinned(self) -> bool:
        return self._shared_pinned and self._tensor is not None

    @property
    def pinned_bytes(self) -> int:
        return 0  # the owner's

    def pin(self) -> bool:
        return self.pinned

    def pin_ranges(self, ranges: Any) -> bool:
        return self.pinned

    def close(self) -> None:
        self._tensor = None


def in_place_source(blocks: list[Block], pin: bool) -> torch.Tensor | None:
    """The uint8 host storage every block's tensors are dense views of, if the blocks can be read from it
    in place (see the module docstring); else None."""
    keys: set[Any] = set()
    whole: torch.Tensor | None = None
    for b in blocks:
        tensors = [t for t in unique_tensors(b.module) if t.numel() > 0]
        if not tensors or any(t.is_meta or t.device.type != "cpu" or not is_dense(t) for t in tensors):
            return None
        keys.update(storage_key(t) for t in tensors)
        if len(keys) > 1:
            return None
        spans = sorted(_byte_span(t) for t in tensors)
        lo, hi = spans[0][0], max(e for _, e in spans)
        if hi - lo > _distinct(spans) + SLACK:
            return None
        whole = storage_bytes(tensors[0])
    if whole is None or (pin and not whole.is_pinned()):
        return None
    reach, owner = -1, -1
    for (a, e), i in _owners(blocks):
        if a < reach and i != owner:
            return None  # two blocks use the same bytes (a tied weight): not independent
        if e > reach:
            reach, owner = e, i
    return whole


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    size = t.element_size()
    start = t.storage_offset() * size
    return start, start + (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))) * size


def _distinct(spans: list[tuple[int, int]]) -> int:
    """Bytes the sorted spans cover (overlaps once)."""
    total, reach = 0, -1
    for a, e in spans:
        a = max(a, reach)
        if e > a:
            total += e - a
        reach = max(reach, e)
    return total


def _owners(blocks: list[Block]) -> list[tuple[tuple[int, int], int]]:
    """Every tensor's byte span with its block's index, sorted by start."""
    return sorted((_byte_span(t), i) for i, b in enumerate(blocks) for t in unique_tensors(b.module) if t.numel() > 0)


def bind_in_place(blocks: list[Block], device: torch.device) -> None:
    """Give each block its region in the source storage (from the first tensor's aligned start) and its
    bindings there, then point its tensors at placeholders as packing does."""
    for b in blocks:
        tensors = unique_tensors(b.module)
        for t in tensors:
            if t.numel() == 0:
                rebind(t, lambda t=t: t.detach().to(device))
        tensors = [t for t in tensors if t.numel() > 0]
        spans = [_byte_span(t) for t in tensors]
        lo = min(a for a, _ in spans) // ALIGNMENT * ALIGNMENT
        hi = max(e for _, e in spans)
        b.region_offset, b.region_nbytes = lo, align_up(hi - lo, ALIGNMENT)
        b.tensor_bytes = _distinct(sorted(spans))
        b.bindings = [Binding(t, a - lo, t.dtype, tuple(t.shape), tuple(t.stride()))
                      for t, (a, _) in zip(tensors, spans, strict=True)]
        b.pieces = []
        b.packed = True
        for x in b.bindings:
            rebind(x.target, lambda x=x: placeholder(x.dtype, device))


class InPlaceFiller(HostCopyFiller):
    """`HostCopyFiller` whose blocks' regions are ranges of the host storage they were built in, when
    they can be (`in_place_source`); `in_place` says whether they were."""

    in_place = False

    def pack(self, packed: list[Block], *, pin: bool, weights: DeferredWeights | None,
             progress: Callable[[int, int], None] | None) -> None:
        source = in_place_source(packed, pin)
        if source is None:
            super().pack(packed, pin=pin, weights=weights, progress=progress)
            return
        bind_in_place(packed, self.device)
        for b in packed:  # a region widened past the storage's end reads no further than it
            b.region_nbytes = min(b.region_nbytes, source.numel() - b.region_offset)
        self.arena = SharedArena(source)
        self.in_place = True
        if progress is not None:
            total = sum(b.tensor_bytes for b in packed)
            progress(total, total)
