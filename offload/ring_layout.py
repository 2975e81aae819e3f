"""Where streamed units go in a byte-budgeted ring: one buffer, each unit at a fixed offset.

A ring of k equal slots (offload/slot_ring.py) prefetches k-1 units ahead whatever their sizes. A
UNet's units range from 2 MB to 0.7 GB (SDXL: the weight sits in six low-resolution transformer units
that compute little, the compute in small high-resolution ones), so k slots of the largest unit hold
only a few small units ahead while those compute, and the link idles exactly when it could fetch the
next big ones. Here the ring is one buffer of `capacity` bytes instead, and units are admitted in
execution order while their bytes are free, so during small units the copies run as many units ahead
as the bytes allow.

Each unit has one offset for good (`ring_offsets`): the units are laid one after another in execution
order, wrapping to the buffer's start where its end is too short, the first unit at the start. So a
unit's tensors are bound to the ring once, at attach, and never re-pointed per step (re-pointing
costs tens of microseconds of Python per tensor: an SDXL UNet has ~1,700). A unit is admitted when no
live unit (admitted, not yet computed) holds any of its bytes; units are freed in execution order.
With equal units and a capacity of k units this is the k-slot ring.

Pure bookkeeping, no torch: the streamer (offload/byte_ring.py) and the step forecast's replay
(engine/planning/step_forecast.py) use the same rule, so the forecast replays what the streamer does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from .units import align_up

PAGE = 4096  # as offload.pinned / offload.address_phase (not imported: they import torch)


def ring_offsets(sizes: Sequence[int], capacity: int, align: int = PAGE) -> list[int]:
    """Each unit's offset: after the previous unit (rounded up to `align`), or 0 where that would pass
    `capacity`; the first unit at 0."""
    if capacity <= 0 or align <= 0:
        raise ValueError(f"a ring needs positive capacity and alignment, got {capacity} and {align}")
    out: list[int] = []
    cursor = 0
    for n in sizes:
        if n > capacity:
            raise ValueError(f"a unit of {n:,} bytes cannot fit a ring of {capacity:,} bytes")
        if cursor + n > capacity:
            cursor = 0
        out.append(cursor)
        cursor = align_up(cursor + n, align)
    return out


class RingLayout:
    """Fixed offsets for units 0..n-1 (execution order) in `capacity` bytes, and which of them are live."""

    def __init__(self, sizes: Sequence[int], capacity: int, align: int = PAGE) -> None:
        self.sizes = tuple(sizes)
        self.capacity = capacity
        self.offsets = tuple(ring_offsets(sizes, capacity, align))
        spans = [(o, o + n) for o, n in zip(self.offsets, self.sizes, strict=True)]
        self._overlaps = tuple(
            tuple(i for i, (lo, hi) in enumerate(spans) if i != j and lo < end and start < hi)
            for j, (start, end) in enumerate(spans))
        self._live: deque[int] = deque()
        self._is_live = [False] * len(self.sizes)

    @property
    def disjoint(self) -> bool:
        """Every unit has bytes of its own: all can be live at once (nothing is ever evicted)."""
        return not any(self._overlaps)

    @property
    def live(self) -> tuple[int, ...]:
        """Units admitted and not yet freed, oldest first."""
        return tuple(self._live)

    @property
    def live_bytes(self) -> int:
        return sum(self.sizes[u] for u in self._live)

    def holds(self, unit: int) -> bool:
        return self._is_live[unit]

    def span(self, unit: int) -> tuple[int, int]:
        return self.offsets[unit], self.offsets[unit] + self.sizes[unit]

    def fits(self, unit: int) -> bool:
        """True when no live unit holds any of `unit`'s bytes (and it is not live itself)."""
        return not self._is_live[unit] and not any(self._is_live[i] for i in self._overlaps[unit])

    def place(self, unit: int) -> bool:
        """Admit `unit` if it fits now; whether it was."""
        if not self.fits(unit):
            return False
        self._live.append(unit)
        self._is_live[unit] = True
        return True

    def pop(self) -> int:
        """Free the oldest live unit."""
        unit = self._live.popleft()
        self._is_live[unit] = False
        return unit

    def clear(self) -> None:
        while self._live:
            self.pop()
