"""Reads of file-tier blocks run ahead of the ring, in its order, so a block's bytes are usually in a bounce slot
when the ring asks for it.

A mixin of `TieredFiller` (offload/tier_filler.py), split out of it so that the filler keeps packing and slot
filling, and this module the queue of reads: which blocks follow the one just filled (the ring's order, then a
re-plan's blocks, `read_next`), which bounce slot each is read into (only once the copy out of it has finished),
and the reads themselves on the reader threads, timed per tier (`stats`). It builds on the bounce ring's lifetime
(`BounceLifetime`, offload/tier_bounce.py), whose `_settle_queue` and `_top_up` it provides. It reads and keeps
the filler's state, set up in `TieredFiller.__init__`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import wait
from typing import TYPE_CHECKING, Any

from .file_blocks import _Pending
from .tier_bounce import BounceLifetime
from .tiers import BOUNCE_SLOTS

if TYPE_CHECKING:
    import threading

    from .block_packing import Block
    from .file_blocks import TierReadStats
    from .file_spans import Run
    from .tier_files import TierFiles
    from .tiers import Tier


class TierReadAhead(BounceLifetime):
    """The read-ahead queue of a tier filler (see the module docstring)."""

    keep_open: bool
    _files: TierFiles
    _queue: deque[_Pending]
    _position: dict[str, int]
    _then: list[str]
    stats: TierReadStats
    _stats_lock: threading.Lock
    _counted_until: dict[str, float]

    def order(self, streamed: Sequence[Block]) -> None:
        """The ring's order (execution order of its blocks): reads run ahead in it. Queued reads that lead
        the new order are kept (a prefetch, `read_next`), the others dropped; the first file-tier blocks are
        queued at once."""
        self._order = [b.name for b in streamed if b.name in self._blocks]
        self._position = {name: i for i, name in enumerate(self._order)}
        self._then = []
        self._keep_leading(self._order)
        if self._order:
            self._ensure_bounce()
            self._top_up(self._order[-1])
        elif not self.keep_open:
            self._close_bounce()

    def read_next(self, names: Sequence[str]) -> list[str]:
        """After the ring's last block, read `names` (the blocks a re-plan will need first, in its order: the
        next expert's) instead of the ring's first ones again; [] stops it. Reads start as slots free up (at
        once, if some are free), so the first `BOUNCE_SLOTS` of them are read while the ring finishes; the
        rest follow as the re-plan takes them. Returns the file-tier blocks among the first ones."""
        self._then = [n for n in names if n in self._blocks]
        if self._then:
            self._ensure_bounce()
        self._top_up(self._order[-1] if self._order else "")
        return self._then[:BOUNCE_SLOTS]

    @property
    def queued(self) -> list[str]:
        """Blocks whose reads are queued or done, waiting for their copy (the ring's order)."""
        return [p.name for p in self._queue]

    def _keep_leading(self, names: Sequence[str]) -> None:
        """Keep the queued reads that are the first of `names`, in order; wait for and drop the others."""
        kept: deque[_Pending] = deque()
        while self._queue:
            p = self._queue.popleft()
            if len(kept) < len(names) and p.name == names[len(kept)]:
                kept.append(p)
            else:
                wait(p.futures)
        self._queue = kept

    def _ahead(self, after: str) -> list[str]:
        """The blocks to read after `after`: the ring's next ones, then `read_next`'s, else the ring's again."""
        names = self._order
        if after in self._position:
            at = self._position[after]
            return names[at + 1:] + (self._then or names[: at + 1])
        if after in self._then:  # a re-plan reading them: the next ones (its ring's come with `order`)
            return self._then[self._then.index(after) + 1:]
        return list(self._then)

    def _top_up(self, after: str) -> None:
        """Queue reads of the file-tier blocks that follow `after` (`_ahead`), while slots last."""
        if self._pool is None or self.bounce is None:
            return
        queued = {p.name for p in self._queue}
        for name in self._ahead(after):
            if len(self._queue) >= BOUNCE_SLOTS:
                break
            if name not in queued:
                self._queue.append(self._submit(name))
                queued.add(name)

    def _submit(self, name: str) -> _Pending:
        busy = {p.slot for p in self._queue}
        slot = next(s for s in range(BOUNCE_SLOTS) if s not in busy)
        fb = self._blocks[name]
        after = self._slot_done[slot]  # the copy out of this slot must finish before it is overwritten
        assert self._pool is not None and self.bounce is not None
        base = slot * self._slot_bytes
        view = memoryview(self.bounce.tensor.numpy()).cast("B")[base : base + self._slot_bytes]
        pending = _Pending(name, slot)
        for run in fb.reads:
            pending.futures.append(self._pool.submit(self._read, run, view, fb.tier, after))
        return pending

    def _read(self, run: Run, view: memoryview, tier: Tier, after: Any) -> int:
        if after is not None:
            after.synchronize()
        start = time.perf_counter()
        n = self._files.read(run, view, tier)
        end = time.perf_counter()
        with self._stats_lock:
            self.stats.bytes[tier] += n
            self.stats.seconds[tier] += max(0.0, end - max(start, self._counted_until[tier]))
            self._counted_until[tier] = end
        return n

    def _take(self, name: str) -> _Pending:
        """The queued read of block `name` (the ring's next one, normally); a miss drops the queue."""
        queue = self._queue
        if any(p.name == name for p in queue):
            while queue[0].name != name:  # blocks the ring skipped: their slots are free again
                wait(queue.popleft().futures)
            return queue.popleft()
        self._settle_queue()
        return self._submit(name)

    def _settle_queue(self, cancel: bool = False) -> None:
        """Wait for the queued reads (`cancel`: those not started yet are dropped instead) and empty the queue."""
        while self._queue:
            futures = self._queue.popleft().futures
            if cancel:
                for f in futures:
                    f.cancel()
            wait(futures)
