"""One bounce ring for every file-tier reader of a load that never reads at the same time as another.

The DiT's streamer reads its page-cache and disk blocks through a ring of `BOUNCE_SLOTS` pinned slots
(offload/tier_filler.py), and so does each encoder streamed layer by layer from its files
(offload/layer_stage.py). Each used to keep a ring of its own for the whole run, although the encoders read
only while the text is encoded and the DiT only while it denoises. On a 32 GB host every pinned byte the
rings hold is a byte no DiT block can be pinned in: a Flux-size plan held 2.7 GB for the DiT and 1.6 GB for
the T5 at once, a Wan-size one 2.8 GB and 1.8 GB.

A pool keeps one arena, as large as the largest ring asked of it (`bounce_ring_bytes` of the largest slot),
and lends it to one reader at a time. A reader that asks while another holds it takes it: the holder first
waits for its reads in flight and for the copies out of its slots (`yield_bounce`), and drops what it had
read ahead. The engine runs every stage and forward on one thread, so the holder is never mid-copy when
asked. When the borrower gives it back (`release`), the reader it took it from gets it again and reads
ahead from where it stopped (`resume_bounce`). The arena stays while any reader may want it again (an encoder
between prompts), and is freed when the last one is done with it (`release(..., done=True)`).

The forecast counts one ring of the largest slot (engine/planning/tier_cost.py `ring_basis`).
"""

from __future__ import annotations

from typing import Protocol

from .pinned import HostArena, PageLocker


class BounceHolder(Protocol):
    """A reader that holds the pool's arena between `acquire` and `release`."""

    def yield_bounce(self) -> None:
        """Stop using the arena: wait for the reads in flight and the copies out of it, drop what was read
        ahead (another reader is about to write into it)."""

    def resume_bounce(self) -> None:
        """The arena is free again: take it back and read ahead."""


class BouncePool:
    """The shared bounce arena of one load (see the module docstring)."""

    def __init__(self) -> None:
        self._arena: HostArena | None = None
        self._holder: BounceHolder | None = None
        self._waiting: list[BounceHolder] = []  # holders it was taken from, the latest last
        self._users: list[BounceHolder] = []  # every reader that may ask for it again

    @property
    def arena(self) -> HostArena | None:
        """The arena while it exists, held or kept idle for a reader that will want it (None: none now)."""
        return self._arena if self._arena is not None and not self._arena.closed else None

    @property
    def holder(self) -> BounceHolder | None:
        return self._holder

    @property
    def waiting(self) -> bool:
        """Whether a reader it was taken from waits to get it back."""
        return bool(self._waiting)

    def acquire(self, holder: BounceHolder, nbytes: int, *, pin: bool, locker: PageLocker | None = None
                ) -> HostArena:
        """The arena, at least `nbytes`, for `holder` alone until it releases it or another reader takes it."""
        current = self._holder
        if current is not None and current is not holder:
            self._holder = None
            current.yield_bounce()
            if current in self._waiting:
                self._waiting.remove(current)
            self._waiting.append(current)
        if holder in self._waiting:
            self._waiting.remove(holder)
        if holder not in self._users:
            self._users.append(holder)
        arena = self.arena
        if arena is None or arena.nbytes < nbytes:
            if arena is not None:
                arena.close()  # nobody uses it now: the holder yielded, and a larger one replaces it
            arena = self._arena = HostArena(nbytes, pin=False, locker=locker)
            if pin:
                arena.pin()  # a failure leaves it pageable (slower, synchronous copies), said by the streamer
        self._holder = holder
        return arena

    def release(self, holder: BounceHolder, *, done: bool = False) -> None:
        """`holder` needs the arena no more for now (`done`: ever): the reader it was taken from gets it back;
        once no reader may want it, it goes."""
        if holder in self._waiting:
            self._waiting.remove(holder)
        if done and holder in self._users:
            self._users.remove(holder)
        if self._holder is holder:
            self._holder = None
            if self._waiting:
                self._waiting.pop().resume_bounce()
        if self._holder is None and not self._users:
            self.close()

    def close(self) -> None:
        """Free the arena (the load is undone)."""
        self._holder = None
        self._waiting.clear()
        self._users.clear()
        if self._arena is not None:
            self._arena.close()
            self._arena = None
