"""Where a file-tier block's bytes are in its files, and where each lands in a bounce slot.

A streamed block whose tier is `page_cache` or `disk` (offload/tiers.py) is never held in host memory:
each time the ring needs it, its tensors are read from their safetensors files into one pinned bounce
slot and copied from there to the device. Reading each tensor on its own would be one syscall per
tensor; instead a block's tensors are grouped into *runs* (one file, byte ranges at most `MERGE_GAP`
apart; safetensors stores a block's tensors side by side, so a block is usually one run) and each run
is read with one `preadv` of its range widened to whole 4 KiB pages, which O_DIRECT needs (file offset,
length and buffer aligned). A run starts on a page of the slot, so a piece's bytes are at
`slot_offset` of the slot, whatever tier reads them. Pure layout: no file is touched here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .tiers import PAGE

MERGE_GAP = 64 << 10  # bytes between two tensors of a block read through rather than split into two reads


@dataclass(frozen=True, slots=True)
class Extent:
    """One tensor's stored bytes: `nbytes` at `offset` of the file `file` (a key of the reader's files)."""

    file: int
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Run:
    """One aligned read: `length` bytes from `start` of `file` into the slot at `slot_offset`.

    `needed` is how many of them must arrive (the last tensor's end): a run widened past the file's end
    gets a short read there, which is not an error."""

    file: int
    start: int
    length: int
    slot_offset: int
    needed: int


def _down(n: int) -> int:
    return n // PAGE * PAGE


def _up(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


def plan_runs(extents: Sequence[Extent]) -> tuple[list[Run], list[int], int]:
    """The aligned reads that cover `extents`, each extent's offset in the slot, and the slot bytes used.

    Extents of one file closer than `MERGE_GAP` share a read; runs are laid out in the slot one after
    another, each on a page."""
    order = sorted(range(len(extents)), key=lambda i: (extents[i].file, extents[i].offset))
    groups: list[list[int]] = []
    for i in order:
        e = extents[i]
        if groups:
            last = extents[groups[-1][-1]]
            end = max(extents[j].offset + extents[j].nbytes for j in groups[-1])
            if last.file == e.file and e.offset - end <= MERGE_GAP:
                groups[-1].append(i)
                continue
        groups.append([i])
    runs: list[Run] = []
    where = [0] * len(extents)
    cursor = 0
    for group in groups:
        file = extents[group[0]].file
        lo = min(extents[i].offset for i in group)
        hi = max(extents[i].offset + extents[i].nbytes for i in group)
        start = _down(lo)
        length = _up(hi) - start
        runs.append(Run(file, start, length, cursor, hi - start))
        for i in group:
            where[i] = cursor + extents[i].offset - start
        cursor += length
    return runs, where, cursor


READ_CHUNK = 8 << 20  # one read job of a run: several of a block's reads in flight at once


def chunks(run: Run, size: int = READ_CHUNK) -> list[Run]:
    """`run` as reads of at most `size` bytes (a page multiple), each with the part of `needed` it holds."""
    out: list[Run] = []
    for at in range(0, run.length, size):
        needed = min(size, run.needed - at)
        if needed <= 0:
            break
        out.append(Run(run.file, run.start + at, min(size, run.length - at), run.slot_offset + at, needed))
    return out
