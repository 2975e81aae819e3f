"""Which bytes of a storage its tensors use, merged into the spans a staged component keeps (offload/stager.py).

A component read into one host arena has a single storage under every weight; a stager keeps only the spans its
own tensors use (a streamed encoder's stager: its non-layer weights, not the arena), aligned so every dtype's
views stay aligned, and bridged over small gaps so that a storage is not cut into many tiny masters.
"""

from __future__ import annotations

import torch

from .pinned import align_up

SPAN_ALIGN = 64  # a span starts and ends on this many bytes (every dtype's views stay aligned)
SPAN_GAP = 4 << 20  # unused bytes between two used ranges of one storage that still share one master


def byte_range(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage that `t` reads: [first, last + 1)."""
    size = t.dtype.itemsize
    start = t.storage_offset() * size
    if t.numel() == 0:
        return start, start
    return start, start + (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))) * size


def used_spans(ranges: list[tuple[int, int]], nbytes: int) -> list[tuple[int, int]]:
    """The used ranges of a storage of `nbytes`, aligned and merged where they overlap or nearly touch."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        a, b = a - a % SPAN_ALIGN, min(align_up(b, SPAN_ALIGN), nbytes)
        if merged and a <= merged[-1][1] + SPAN_GAP:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged
