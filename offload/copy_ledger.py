"""The streamer's copy accounting: one ledger shared by its ring, its slot filler and its resident copies.

Copies and bytes count when issued (the ring adds them); a copy's time and the compute stream's
stall count when their timing events resolve (`absorb`), which also publishes each copy as a
staging event. `take` hands the totals since the previous call to the step clock and never blocks
unless asked to.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .events import BlocksSkipped, BlockTiming, EventBus, StagingEvent
from .stream_stats import StepStats
from .tiers import Tier
from .transfer_timing import Measured, TransferClock


class CopyLedger:
    """Totals of the block copies since the last `take` (see the module docstring)."""

    def __init__(self, cuda: bool, bus: EventBus) -> None:
        self.cuda = cuda
        self.bus = bus
        self.clock = TransferClock(cuda)
        self.stall_s = 0.0
        self.h2d_bytes = 0
        self.transfers = 0
        self.sync_fetches = 0
        self.skipped_blocks = 0  # streamed blocks a step cache skipped: no copy issued for them
        self.skipped_bytes = 0
        self._run: list[tuple[str, int]] = []  # the run of skipped blocks not yet published
        self.async_bytes = 0  # resolved asynchronous copies: the link's rate as streamed
        self.async_seconds = 0.0
        self.tiers: dict[str, Tier] = {}  # block name → its host tier when not pinned (staging events carry it)

    @property
    def observed_bandwidth(self) -> float | None:
        """Bytes per second of the block copies resolved so far (None before any): the asynchronous ones
        on CUDA (a synchronous warm-up copy would understate the link), every copy on a CPU."""
        return self.async_bytes / self.async_seconds if self.async_seconds > 0 else None

    def absorb(self, measured: Iterable[Measured]) -> None:
        """Account resolved measurements and publish the copies as staging events."""
        cuda = self.cuda
        for m in measured:
            if m.kind != "copy":  # a block's compute, or the compute stream's wait for its copy (a stall)
                if m.kind == "stall":
                    self.stall_s += m.seconds
                self.bus.publish(BlockTiming(target=m.target, kind=m.kind, seconds=m.seconds,
                                             start=m.t if cuda else m.t - m.seconds))
                continue
            if m.sync or not cuda:
                self.stall_s += m.seconds
            if m.kind == "copy" and (not m.sync or not cuda) and m.seconds > 0:  # on a CPU all are sync
                self.async_bytes += m.nbytes
                self.async_seconds += m.seconds
            if m.kind == "copy":
                self.bus.publish(
                    StagingEvent(target=m.target, direction="h2d", nbytes=m.nbytes, seconds=m.seconds, sync=m.sync,
                                 t=m.t, tier=self.tiers.get(m.target, "pinned"), start=m.t if cuda else m.t - m.seconds)
                )

    def compute_started(self, stream: Any) -> Any:
        """A streamed block's forward begins (after its copy's wait) on `stream`: the mark `compute_done` closes."""
        return self.clock.start(stream)

    def compute_done(self, mark: Any, name: str, stream: Any) -> None:
        """The block's forward has been issued: its compute time resolves, and is published, like a copy's."""
        self.clock.finish(mark, "compute", name, 0, stream=stream)

    def skipped(self, name: str, nbytes: int) -> None:
        """A streamed block the step cache skipped: its region was not copied for this forward."""
        self.skipped_blocks += 1
        self.skipped_bytes += nbytes
        self._run.append((name, nbytes))

    def end_skips(self) -> None:
        """A block runs (or the step ends): the run of skipped blocks before it is one event."""
        if self._run:
            run, self._run = self._run, []
            self.bus.publish(BlocksSkipped(first=run[0][0], last=run[-1][0], blocks=len(run),
                                           nbytes=sum(n for _, n in run)))

    def settle(self) -> None:
        """Resolve every measurement (the device has been synchronized: nothing is left in flight)."""
        self.absorb(self.clock.drain() if self.cuda else self.clock.poll())

    def take(self, wait: bool = False) -> StepStats:
        """Totals since the previous call; `wait` resolves copies still running (teardown, tests)."""
        self.end_skips()
        self.absorb(self.clock.drain() if self.cuda and wait else self.clock.poll())
        stats = StepStats(self.stall_s, self.h2d_bytes, self.transfers, self.sync_fetches, self.skipped_blocks,
                          self.skipped_bytes)
        self.stall_s, self.h2d_bytes, self.transfers, self.sync_fetches = 0.0, 0, 0, 0
        self.skipped_blocks = self.skipped_bytes = 0
        return stats
