"""Where streamed units go in a byte-budgeted ring: one buffer, units placed first-in first-out.

A ring of k equal slots (offload/block_ring.py) prefetches k-1 units ahead whatever their sizes. A
UNet's units range from 2 MB to 0.7 GB (SDXL: the weight sits in six low-resolution transformer units
that compute little, the compute in small high-resolution ones), so k slots of the largest unit hold
only a few small units ahead while those compute, and the link idles exactly when it could fetch the
next big ones. Here the ring is one buffer of `capacity` bytes instead: units are admitted in
execution order while they fit, so during small units the copies run as many units ahead as the
bytes allow.

Units are freed in the order they were placed (compute consumes them in execution order), so the
live units occupy one cyclic range of the buffer. A unit goes right after the newest one or, when it
does not fit before the buffer's end, at its start (the tail left unused until the oldest unit there
is freed). With equal units and a capacity of k units this is exactly the k-slot ring.

Pure bookkeeping, no torch: the streamer (offload/byte_ring.py) and the step forecast's replay
(engine/step_forecast.py) use the same rule, so the forecast replays what the streamer does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .units import align_up

PAGE = 4096  # as offload.pinned / offload.address_phase (not imported: they import torch)


@dataclass(frozen=True, slots=True)
class Placed:
    """A live unit: its index (in the ring's cyclic order) and its bytes [offset, offset + nbytes)."""

    unit: int
    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


class RingLayout:
    """First-in first-out placement of units in `capacity` bytes; every offset a multiple of `align`.

    `align` is a page by default: on a CPU a unit bound there keeps its tensors' page phase
    (offload/address_phase.py), on CUDA it costs at most a page per unit.
    """

    def __init__(self, capacity: int, align: int = PAGE) -> None:
        if capacity <= 0 or align <= 0:
            raise ValueError(f"a ring needs positive capacity and alignment, got {capacity} and {align}")
        self.capacity = capacity
        self.align = align
        self._live: deque[Placed] = deque()

    @property
    def live(self) -> tuple[Placed, ...]:
        """The units placed and not yet freed, oldest first."""
        return tuple(self._live)

    @property
    def live_bytes(self) -> int:
        return sum(p.nbytes for p in self._live)

    def holds(self, unit: int) -> Placed | None:
        return next((p for p in self._live if p.unit == unit), None)

    def offset_for(self, nbytes: int) -> int | None:
        """Where a unit of `nbytes` would go now, or None while the live units leave no room for it."""
        if nbytes > self.capacity:
            raise ValueError(f"a unit of {nbytes:,} bytes cannot fit a ring of {self.capacity:,} bytes")
        if not self._live:
            return 0
        head = self._live[0].offset
        tail = align_up(self._live[-1].end, self.align)
        if self._live[-1].offset >= head:  # live bytes are one range [head, tail): room after it or before it
            if tail + nbytes <= self.capacity:
                return tail
            return 0 if nbytes <= head else None
        return tail if tail + nbytes <= head else None  # wrapped: the room is between the newest and the oldest

    def place(self, unit: int, nbytes: int) -> int | None:
        """Place `unit` after the newest one (or at the buffer's start); its offset, or None if it does not fit."""
        if self.holds(unit) is not None:
            raise ValueError(f"unit {unit} is already in the ring")
        offset = self.offset_for(nbytes)
        if offset is not None:
            self._live.append(Placed(unit, offset, nbytes))
        return offset

    def pop(self) -> Placed:
        """Free the oldest unit."""
        return self._live.popleft()

    def clear(self) -> None:
        self._live.clear()
