"""Streamed blocks the host refused to page-lock: read from their files, not held pageable.

A load page-locks the streamed blocks' arena block by block as they land (offload/arena_fill.py). When
the driver refuses part way (out of lockable memory, a memlock limit), the blocks already locked stay
locked. A refused block held in pageable memory is what issue 35 forbids: the kernel may swap it out, and
every copy of it is synchronous. So each refused block whose weights were read from their files is moved
to the page-cache tier instead (offload/tier_filler.py reads it at each use through the bounce ring, as a
block the planner put there) and its arena pages are given back to the kernel. The load says so in one
line and its report carries the figures (`PinFallback`).

The sources are noted before the reads, which forget them (`DeferredWeights.source_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .block_packing import Block
from .deferred_weights import DeferredWeights, Source
from .units import format_bytes


@dataclass(frozen=True, slots=True)
class NotedPiece:
    """One piece of a block's region: `nbytes` at `offset` (in the region), and the file range it was read
    from (`source`, converted through `via` to `dtype`), or None for bytes no file holds."""

    offset: int
    nbytes: int
    source: Source | None = None
    via: torch.dtype | None = None
    dtype: torch.dtype | None = None


@dataclass(frozen=True, slots=True)
class PinFallback:
    """What a refused page-lock changed: `blocks` streamed blocks (`nbytes` of weights) read from the page
    cache instead of pinned, `released` arena bytes given back, `kept` refused blocks left pageable (not
    read from files: nothing else holds them), and the driver's `reason`."""

    blocks: int
    nbytes: int
    released: int
    kept: int
    pinned_blocks: int
    reason: str

    def line(self) -> str:
        """The one line an operator sees."""
        kept = (f"; {self.kept} more stay in pageable memory (copied synchronously: not loaded from their "
                "files)") if self.kept else ""
        return (f"page-locking stopped after {self.pinned_blocks} streamed blocks ({self.reason}): "
                f"{self.blocks} blocks ({format_bytes(self.nbytes)}) are read from the page cache instead"
                f"{kept}")


def note_pieces(blocks: Sequence[Block], weights: DeferredWeights | None) -> dict[str, list[NotedPiece]]:
    """Each laid-out block's pieces, with the file range of those still waiting for their bytes."""
    out: dict[str, list[NotedPiece]] = {}
    for b in blocks:
        pieces: list[NotedPiece] = []
        for p in b.pieces:
            target = p.binding.target if p.binding is not None else None
            if p.deferred and target is not None and weights is not None and weights.knows(target):
                source, via = weights.source_of(target)
                pieces.append(NotedPiece(p.offset, p.nbytes, source, via, p.binding.dtype if p.binding else None))
            else:
                pieces.append(NotedPiece(p.offset, p.nbytes))
        out[b.name] = pieces
    return out


def refused_blocks(blocks: Sequence[Block], unpinned: Sequence[tuple[int, int]]) -> list[Block]:
    """The blocks whose arena region overlaps a range that could not be page-locked."""
    return [b for b in blocks
            if any(lo < b.region_offset + b.region_nbytes and b.region_offset < hi for lo, hi in unpinned)]


def from_files(pieces: Sequence[NotedPiece] | None) -> bool:
    """Whether a block's bytes can be read again from its files (some piece was read from one)."""
    return bool(pieces) and any(p.source is not None for p in pieces or ())
