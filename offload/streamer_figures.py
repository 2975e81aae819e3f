"""What a `LayerwiseStreamer` holds and moves, as figures (counts and bytes): read by the engine's reports,
the console's panels and the tests; no behaviour. A mixin over the streamer's own state (offload/streamer.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .byte_ring import ring_capacity
from .tier_filler import TieredFiller
from .tiers import Tier

if TYPE_CHECKING:
    from .block_packing import Block
    from .copy_ledger import CopyLedger
    from .pin_fallback import PinFallback
    from .slot_filler import SlotFiller
    from .slot_ring import Ring


class StreamerFigures:
    """Counts and bytes of the streamer's blocks, slots, arena and bounce ring."""

    _attached: bool
    _blocks: list[Block]
    _streamed: list[Block]
    _cuda: bool
    _ledger: CopyLedger
    _resident_bytes: int
    filler: SlotFiller
    ring: Ring | None
    keep_masters: bool

    @property
    def attached(self) -> bool:
        return self._attached

    @property
    def num_streamed(self) -> int:
        return len(self._streamed)

    @property
    def num_resident(self) -> int:
        return sum(1 for b in self._blocks if b.resident)

    @property
    def num_parked(self) -> int:
        """Blocks left out of the ring (`active` False, not resident): only their masters exist."""
        return len(self._blocks) - self.num_resident - len(self._streamed)

    @property
    def streamed_bytes(self) -> int:
        """Weight bytes of the streamed blocks (what the planner calls streamed per forward)."""
        return sum(b.tensor_bytes for b in self._streamed)

    @property
    def copy_bytes(self) -> int:
        """Bytes one forward's copies move: each streamed block's packed region, its weights plus the
        alignment padding between and after its tensors (`block_packing`), so a step's copied bytes
        are this, not `streamed_bytes`, per forward."""
        return sum(b.region_nbytes for b in self._streamed)

    @property
    def largest_block_bytes(self) -> int:
        return max((b.region_nbytes for b in self._streamed), default=0)

    @property
    def slot_bytes(self) -> int:
        """Device bytes held by the slots (`residency.slots` of them while attached)."""
        return sum(s.numel() for s in self.ring.slots) if self.ring is not None else 0

    @property
    def num_slots(self) -> int:
        """Device slots allocated now (`residency.slots` while attached, 0 otherwise); a byte ring counts
        the slots its bytes stand for."""
        return self.ring.num_slots if self.ring is not None else 0

    def ring_capacity(self, slots: int) -> int:
        """Bytes of a byte ring standing for `slots` slots (see offload/byte_ring.py)."""
        return ring_capacity(slots, self.filler.slot_nbytes(self._streamed), self._cuda)

    @property
    def observed_bandwidth(self) -> float | None:
        """Bytes per second of the block copies resolved so far (None before any), see `CopyLedger`."""
        return self._ledger.observed_bandwidth

    def block_states(self) -> list[tuple[str, str, int]]:
        """(name, state, bytes) per block; state is resident / device / in_flight / host."""
        if self.ring is not None:
            return self.ring.block_states(self._blocks)
        return [(b.name, "resident" if b.resident else "host", b.tensor_bytes) for b in self._blocks]

    @property
    def host_bytes(self) -> int:
        """Host bytes the streamer holds: the arena of pinned-tier blocks and any bounce ring."""
        arena = self.filler.arena
        held = arena.held_bytes if arena is not None else 0  # less what a refused page-lock gave back
        return held + self.bounce_bytes

    @property
    def pinned_bytes(self) -> int:
        arena = self.filler.arena
        bounce = self.filler.bounce if isinstance(self.filler, TieredFiller) else None
        pinned = arena.pinned_bytes if arena is not None else 0  # what is registered (partial: some blocks)
        return pinned + (bounce.pinned_bytes if bounce is not None and bounce.pinned else 0)

    @property
    def bounce_bytes(self) -> int:
        """Host bytes of the bounce ring that page-cache and disk blocks are read through (0: none)."""
        return self.filler.bounce_bytes if isinstance(self.filler, TieredFiller) else 0

    def tier_bytes(self) -> dict[Tier, int]:
        """Bytes of the blocks the host keeps per tier (pinned: in the arena; page_cache, disk: in files): the
        streamed ones; with masters (two experts) every block, the idle expert's and resident ones too."""
        out: dict[Tier, int] = {"pinned": 0, "page_cache": 0, "disk": 0}
        files = self.filler.file_blocks if isinstance(self.filler, TieredFiller) else {}
        for b in self._blocks if self.keep_masters else self._streamed:
            out[files.get(b.name, "pinned")] += b.tensor_bytes
        return out

    @property
    def pin_fallback(self) -> PinFallback | None:
        """Set when the host refused to page-lock some blocks and they went to the page cache instead."""
        return self.filler.pin_fallback if isinstance(self.filler, TieredFiller) else None

    @property
    def pin_failure_reason(self) -> str | None:
        arena = self.filler.arena
        return arena.pin_failure_reason if arena is not None else None

    @property
    def resident_bytes(self) -> int:
        return self._resident_bytes
