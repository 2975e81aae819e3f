"""Which DiT blocks stay on the device, and how many device slots the streamed ones cycle through.

This is the one place residency of DiT blocks is decided. The plan (engine/planning/plan.py) resolves a
policy into a `BlockResidency`, forecasts memory and time from it, and placement hands that same
object to `LayerwiseStreamer`, which streams exactly the blocks marked streamed through exactly
`slots` slots.

Two placements choose *which* blocks stay resident for a given count:
- `leading`: vLLM-Omni's `resident_layers` — the first N blocks in execution order. Everything
  streamed then runs back to back, so only the copies the ring can hold ahead (k-1 blocks) hide
  behind the resident prefix;
- `spread`: the streamed blocks are spaced evenly through the execution order, so each one's copy
  overlaps the resident blocks computing before it. vLLM-Omni has no spelling for it.

The ring has k slots: while one block computes, up to k-1 of the next streamed blocks are copied.
A ring never needs more slots than there are streamed blocks (then nothing is ever evicted). One
slot is allowed (no prefetch: each block is copied when it is needed, the smallest peak).
With `byte_ring` the k slots' bytes are one buffer instead, filled with as many of the next units as
fit (offload/ring_layout.py): for blocks of very different sizes (a UNet's units).

With fp8 storage, `upcast` marks resident blocks kept in the compute dtype: converted once at load
(offload/upcast.py) instead of before every forward, for twice their fp8 device bytes. Which ones:
`with_upcast(n)` takes the first n resident blocks in execution order (every fp8 block's upcast costs
the same time per byte it would add, so which ones matters less than how many; the first run first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Placement = Literal["leading", "spread"]
PLACEMENTS: tuple[Placement, ...] = ("leading", "spread")
DEFAULT_SLOTS = 2  # the block that runs and the one copied for it


def slots_for(num_streamed: int, requested: int = DEFAULT_SLOTS) -> int:
    """Device slots a ring of `requested` slots uses for `num_streamed` blocks (never more than them)."""
    return min(num_streamed, requested)


def spread_streamed(num_blocks: int, num_streamed: int) -> tuple[bool, ...]:
    """True at the positions of `num_streamed` blocks spaced evenly over `num_blocks` (Bresenham).

    Each streamed block closes its share of the order, so the resident blocks of that share run
    (and hide its copy) before it: position i is streamed when floor((i+1)·S/N) steps up.
    """
    if not 0 <= num_streamed <= num_blocks:
        raise ValueError(f"streamed blocks must be in [0, {num_blocks}], got {num_streamed}")
    return tuple((i + 1) * num_streamed // num_blocks > i * num_streamed // num_blocks for i in range(num_blocks))


@dataclass(frozen=True, slots=True)
class BlockResidency:
    """Per DiT block in execution order: resident (True) or streamed (False); and the ring's slot count."""

    resident: tuple[bool, ...]
    slots: int
    placement: Placement = "leading"
    byte_ring: bool = False  # the slots' bytes as one buffer, units admitted while they fit (offload/byte_ring.py)
    upcast: tuple[bool, ...] = ()  # fp8 storage: resident blocks kept in the compute dtype (() or one per block)

    def __post_init__(self) -> None:
        if self.upcast and (len(self.upcast) != len(self.resident)
                            or any(u and not r for u, r in zip(self.upcast, self.resident, strict=True))):
            raise ValueError("upcast marks resident blocks only, one flag per block")
        if self.upcast and not any(self.upcast):
            object.__setattr__(self, "upcast", ())  # none kept upcast: one spelling, so equal residencies compare equal
        streamed = self.num_streamed
        if streamed == 0 and self.slots != 0:
            raise ValueError(f"no streamed blocks needs 0 slots, got {self.slots}")
        if streamed and not 1 <= self.slots <= streamed:
            raise ValueError(f"{streamed} streamed blocks need between 1 and {streamed} slots, got {self.slots}")

    @classmethod
    def leading(cls, num_blocks: int, resident_layers: int, slots: int = DEFAULT_SLOTS) -> BlockResidency:
        """vLLM-Omni's `resident_layers`: the leading N blocks in execution order stay resident."""
        if not 0 <= resident_layers <= num_blocks:
            raise ValueError(f"resident_layers must be in [0, {num_blocks}], got {resident_layers}")
        resident = tuple(i < resident_layers for i in range(num_blocks))
        return cls(resident, slots_for(num_blocks - resident_layers, slots), "leading")

    @classmethod
    def spread(cls, num_blocks: int, resident_count: int, slots: int = DEFAULT_SLOTS) -> BlockResidency:
        """`resident_count` blocks stay resident, the streamed ones spaced evenly between them."""
        if not 0 <= resident_count <= num_blocks:
            raise ValueError(f"resident blocks must be in [0, {num_blocks}], got {resident_count}")
        streamed = spread_streamed(num_blocks, num_blocks - resident_count)
        return cls(tuple(not s for s in streamed), slots_for(num_blocks - resident_count, slots), "spread")

    @classmethod
    def placed(cls, placement: Placement, num_blocks: int, resident_count: int,
               slots: int = DEFAULT_SLOTS) -> BlockResidency:
        """The residency `placement` gives for `resident_count` resident blocks."""
        if placement == "spread":
            return cls.spread(num_blocks, resident_count, slots)
        return cls.leading(num_blocks, resident_count, slots)

    @classmethod
    def all_resident(cls, num_blocks: int) -> BlockResidency:
        """No streaming at all (the `resident` baseline mode)."""
        return cls((True,) * num_blocks, 0)

    def with_upcast(self, count: int) -> BlockResidency:
        """The first `count` resident blocks (execution order; all of them when fewer) kept upcast."""
        flags, left = [], max(count, 0)
        for r in self.resident:
            flags.append(r and left > 0)
            left -= r
        return BlockResidency(self.resident, self.slots, self.placement, self.byte_ring, tuple(flags))

    @property
    def upcast_flags(self) -> tuple[bool, ...]:
        """Per block: kept in the compute dtype (resident, converted once at load)."""
        return self.upcast or (False,) * len(self.resident)

    @property
    def num_upcast(self) -> int:
        return sum(self.upcast)

    @property
    def num_blocks(self) -> int:
        return len(self.resident)

    @property
    def num_resident(self) -> int:
        return sum(self.resident)

    @property
    def num_streamed(self) -> int:
        return len(self.resident) - self.num_resident

    @property
    def resident_indices(self) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.resident) if r)

    @property
    def is_leading(self) -> bool:
        """True when the resident blocks are exactly a prefix (vLLM-Omni's `resident_layers` can say it)."""
        n = self.num_resident
        return all(r == (i < n) for i, r in enumerate(self.resident))

    def slot_bytes(self, largest_streamed_block_bytes: int) -> int:
        """Device bytes the slots take: each slot holds the largest streamed block."""
        return self.slots * largest_streamed_block_bytes
