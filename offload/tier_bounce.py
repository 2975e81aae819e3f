"""When a tier filler's bounce ring exists: opened for the first file-tier read, closed when no read needs it, and,
where the load shares one ring among its readers (offload/bounce_pool.py), lent to another reader between uses.

A mixin of `TieredFiller` (offload/tier_filler.py), whose state it reads: `_blocks` (the file-tier blocks),
`bounce` (the arena while held), `_slot_bytes`, `_pool` (the reader threads), `_slot_done` (each slot's last
copy out), the read-ahead queue (`_settle_queue`, `_top_up`, `_order`, `_last`: offload/tier_read_ahead.py,
whose `TierReadAhead` builds on this class) and `_bounce_pool`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .tiers import BOUNCE_SLOTS

if TYPE_CHECKING:
    from .bounce_pool import BouncePool
    from .file_blocks import _FileBlock
    from .options import LoadOptions
    from .pinned import HostArena

READERS = 2 * BOUNCE_SLOTS  # reader threads: every bounce slot's reads, two chunks each, in flight


class BounceLifetime:
    """The bounce ring's lifetime (see the module docstring)."""

    _blocks: dict[str, _FileBlock]
    bounce: HostArena | None
    _slot_bytes: int
    _pool: ThreadPoolExecutor | None
    _slot_done: list[Any]
    _order: list[str]
    _last: str
    _wants_bounce: bool
    _pin_bounce: bool
    _bounce_pool: BouncePool  # the load's shared one, or one of its own
    _load_options: LoadOptions

    def _settle_queue(self, cancel: bool = False) -> None:
        raise NotImplementedError

    def _top_up(self, after: str) -> None:
        raise NotImplementedError

    def _ensure_bounce(self) -> None:
        if not self._blocks:
            return
        self._wants_bounce = True
        if self.bounce is None:
            self._slot_bytes = max(fb.slot_bytes for fb in self._blocks.values())
            self.bounce = self._bounce_pool.acquire(self, BOUNCE_SLOTS * self._slot_bytes, pin=self._pin_bounce,
                                                    locker=self._load_options.page_locker)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(READERS, thread_name_prefix="tier-read")

    def _let_go(self) -> None:
        """Stop using the bounce ring: the reads queued but not started are dropped, the others and the copies
        out of its slots finish; the arena is then the pool's again."""
        self._settle_queue(cancel=True)
        for event in self._slot_done:
            if event is not None:
                event.synchronize()
        self._slot_done = [None] * BOUNCE_SLOTS
        self.bounce = None

    def _close_bounce(self) -> None:
        """No read needs the bounce ring (the ring streams no file-tier block): its host bytes go."""
        self._wants_bounce = False
        self._let_go()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._bounce_pool.release(self, done=True)  # its last user: the arena goes

    # ------------------------------------------------------------------ a ring shared with the load's other readers
    def yield_bounce(self) -> None:
        """Another reader takes the shared ring (offload/bounce_pool.py): what was read ahead is dropped."""
        self._let_go()

    def resume_bounce(self) -> None:
        """The shared ring is free again: take it back and read ahead from where the ring stopped."""
        if self._wants_bounce and self.bounce is None:
            self._ensure_bounce()
            self._top_up(self._last or (self._order[-1] if self._order else ""))

    def park(self) -> None:
        """Between stages (a layer-streamed encoder's): give a shared ring back to the reader it was taken from (the
        DiT's), if one waits for it; the next stage's first read takes it again. Else it stays, as a ring of its
        own does, read ahead for the next stage."""
        if self.bounce is not None and self._bounce_pool.waiting:
            self._let_go()
            self._bounce_pool.release(self)
