"""Live re-plan: a streamer changes which of its blocks are resident, and its ring's depth, between requests (or
between two forwards, an expert switch), from the host masters it kept, without repacking.

A mixin of `LayerwiseStreamer` (offload/streamer.py), split out of it so that the streamer keeps the blocks,
attach/detach and the ring, and this module what needs `keep_masters`: `replan` (blocks made resident get a
device copy of their master, from the arena or read from their files; blocks made streamed free theirs and join
the ring), `read_ahead_for` (the file reads a coming re-plan will need, started early), `refresh_resident` and
the watchers told of every fresh device copy. It reads and keeps the streamer's state, set up in
`LayerwiseStreamer.__init__`, and calls back into the streamer for the ring (`_clear_ring`, `_build_ring`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .devices import synchronize
from .resident_blocks import copy_resident, drop_resident, read_resident
from .stream_stats import ReplanStats
from .tier_filler import TieredFiller

if TYPE_CHECKING:
    import torch

    from .block_packing import Block
    from .copy_ledger import CopyLedger
    from .residency import BlockResidency
    from .slot_filler import SlotFiller
    from .upcast import BlockUpcast


class StreamerReplan:
    """A streamer's re-plans between requests (see the module docstring)."""

    device: torch.device
    keep_masters: bool
    residency: BlockResidency
    active: tuple[bool, ...]
    filler: SlotFiller
    _attached: bool
    _blocks: list[Block]
    _streamed: list[Block]
    _upcast: BlockUpcast | None
    _ledger: CopyLedger
    _resident_bytes: int
    _resident_watchers: list[Callable[[Block], None]]

    def _clear_ring(self) -> None:
        raise NotImplementedError

    def _remove_hooks(self) -> None:
        raise NotImplementedError

    def _build_ring(self) -> None:
        raise NotImplementedError

    def _check_active(self, active: Sequence[bool] | None) -> tuple[bool, ...]:
        raise NotImplementedError

    def _ring_blocks(self) -> list[Block]:
        raise NotImplementedError

    def replan(self, residency: BlockResidency, active: Sequence[bool] | None = None) -> ReplanStats:
        """Carry out another residency between requests, from the masters: the arena's, or (a block whose
        master is in a page-cache or disk tier) read from its files; no repacking.

        Blocks that become resident get a device copy of their region; blocks that become streamed
        free theirs and join the ring; the ring is rebuilt with the new depth. Needs `keep_masters`.
        `active` parks the blocks it marks False (see the class); default: every block active. Between
        two forwards (an expert switch inside a request) it is as safe as between requests: it waits
        for the device before it frees anything.
        """
        if not self.keep_masters:
            raise RuntimeError("this streamer keeps no host copy of its resident blocks: load with live re-plan on")
        if not self._attached:
            raise RuntimeError("replan needs an attached streamer")
        if residency.num_blocks != len(self._blocks):
            raise ValueError(f"residency covers {residency.num_blocks} blocks, the streamer holds {len(self._blocks)}")
        start = time.perf_counter()
        self._clear_ring()
        self._remove_hooks()
        copied = freed = 0
        pairs = list(zip(self._blocks, residency.resident, strict=True))
        upcast = self._upcast.keep(self._blocks, residency.upcast_flags) if self._upcast else ()  # made again
        for b, resident in pairs:  # every release before any copy: the peak never holds both sets
            if b.resident and (not resident or b.name in upcast):
                freed += self._drop_resident(b)
                b.resident = False
        files = file_bytes = 0
        for b, resident in pairs:
            if resident and not b.resident:
                b.resident = True
                n = self._make_resident(b)
                copied += n
                if self._from_files(b):
                    files, file_bytes = files + 1, file_bytes + n
        self.active = self._check_active(active)
        self._streamed = self._ring_blocks()
        self.residency = residency
        self._resident_bytes = sum(b.tensor_bytes for b in self._blocks if b.resident)
        ring_before = self._ledger.h2d_bytes
        self._build_ring()
        synchronize(self.device)
        return ReplanStats(copied_bytes=copied, freed_bytes=freed, ring_bytes=self._ledger.h2d_bytes - ring_before,
                           seconds=time.perf_counter() - start, file_blocks=files, file_bytes=file_bytes)

    def read_ahead_for(self, residency: BlockResidency | None, active: Sequence[bool] | None = None) -> list[str]:
        """Start reading, from their files, the first blocks that `replan(residency, active)` will take (the
        ones it makes resident, then its ring's), in the bounce slots the ring's wrap-around would use, so a
        re-plan at the next forward (an expert switch) finds them read. None stops it. Returns the blocks
        read ahead ([]: none is in a file tier)."""
        if not isinstance(self.filler, TieredFiller):
            return []
        if residency is None:
            return self.filler.read_next([])
        flags = self._check_active(active)
        pairs = list(zip(self._blocks, residency.resident, flags, strict=True))
        first = [b.name for b, r, _ in pairs if r and not b.resident]  # `replan` makes these resident first
        ring = [b.name for b, r, a in pairs if a and not r]
        return self.filler.read_next(first + ring)

    def watch_resident(self, watch: Callable[[Block], None]) -> None:
        """Call `watch(block)` each time a block gets a fresh device copy of its master (a re-plan, an expert
        switch, `refresh_resident`), after its fp8 upcast if kept: what was written into the last copy is gone."""
        self._resident_watchers.append(watch)

    def refresh_resident(self, names: Sequence[str]) -> int:
        """Give the named resident blocks fresh device copies of their masters, undoing whatever was written into
        the old ones (a merged LoRA), one block at a time; needs `keep_masters`. Returns the bytes copied."""
        if not self.keep_masters:
            raise RuntimeError("this streamer keeps no host copy of its resident blocks")
        wanted, copied = set(names), 0
        for b in self._blocks:
            if b.resident and b.name in wanted:
                self._drop_resident(b)
                copied += self._make_resident(b)
        synchronize(self.device)
        return copied

    def _from_files(self, b: Block) -> bool:
        """Whether block b's master is in its files (a page-cache or disk tier), not in the arena."""
        return isinstance(self.filler, TieredFiller) and b.name in self.filler.file_blocks

    def _make_resident(self, b: Block) -> int:
        """Give a packed block its own device copy of its region (from the arena, or read from its files
        through the bounce ring, as the ring would) and bind it there; returns bytes copied."""
        if self._from_files(b):
            n = read_resident(b, self.filler, self.device)
        else:
            assert self.filler.arena is not None
            n = copy_resident(b, self.filler.arena, self.device, self._ledger.clock)
        if self._upcast is not None:
            self._upcast.hold(b)  # resident fp8: upcast before each forward (or once, if kept upcast)
        for watch in self._resident_watchers:
            watch(b)
        return n

    def _drop_resident(self, b: Block) -> int:
        """Free a resident block's device copy (its master stays in the arena); returns bytes freed."""
        upcast = self._upcast.drop(b) if self._upcast is not None else 0  # a block kept upcast: its copies
        return drop_resident(b, self.device) + upcast
