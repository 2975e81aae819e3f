"""Which DiT blocks stay on the device and how many device slots the streamed ones share.

This is the one place residency of DiT blocks is decided. The plan (engine/plan.py) resolves a
policy into a `BlockResidency`, forecasts memory from it, and placement hands that same object to
`LayerwiseStreamer`, which streams exactly the blocks marked streamed through exactly `slots` slots.

Today's ring holds at most two slots: the block that runs and the one prefetched for it. A single
streamed block needs only one (it prefetches itself), so `slots_for` gives min(streamed, 2).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_SLOTS = 2  # the streamer's ring: the running block and the next one


def slots_for(num_streamed: int) -> int:
    """Device slots the streamer allocates for `num_streamed` streamed blocks (0, 1 or 2)."""
    return min(num_streamed, MAX_SLOTS)


@dataclass(frozen=True, slots=True)
class BlockResidency:
    """Per DiT block in execution order: resident (True) or streamed (False); and the slot count."""

    resident: tuple[bool, ...]
    slots: int

    def __post_init__(self) -> None:
        streamed = self.num_streamed
        if streamed == 0 and self.slots != 0:
            raise ValueError(f"no streamed blocks needs 0 slots, got {self.slots}")
        if streamed and not 1 <= self.slots <= min(streamed, MAX_SLOTS):
            raise ValueError(
                f"{streamed} streamed blocks need between 1 and {min(streamed, MAX_SLOTS)} slots, got {self.slots}"
            )

    @classmethod
    def leading(cls, num_blocks: int, resident_layers: int) -> BlockResidency:
        """vLLM-Omni's `resident_layers`: the leading N blocks in execution order stay resident."""
        if not 0 <= resident_layers <= num_blocks:
            raise ValueError(f"resident_layers must be in [0, {num_blocks}], got {resident_layers}")
        resident = tuple(i < resident_layers for i in range(num_blocks))
        return cls(resident, slots_for(num_blocks - resident_layers))

    @classmethod
    def all_resident(cls, num_blocks: int) -> BlockResidency:
        """No streaming at all (the `resident` baseline mode)."""
        return cls((True,) * num_blocks, 0)

    @property
    def num_blocks(self) -> int:
        return len(self.resident)

    @property
    def num_resident(self) -> int:
        return sum(self.resident)

    @property
    def num_streamed(self) -> int:
        return len(self.resident) - self.num_resident

    def slot_bytes(self, largest_streamed_block_bytes: int) -> int:
        """Device bytes the slots take: each slot holds the largest streamed block."""
        return self.slots * largest_streamed_block_bytes
