"""The load's shared bounce arena (offload/bounce_pool.py): one reader at a time, taken from an idle holder and given
back to it, grown to the largest ring asked, freed once no reader may want it."""

from __future__ import annotations

from omni_console.offload.bounce_pool import BouncePool
from omni_console.offload.pinned import arena_bytes_held


class Reader:
    """A holder that records what the pool asked of it, and takes the arena back when told to (as TieredFiller)."""

    def __init__(self, pool: BouncePool, name: str, nbytes: int, log: list[str]) -> None:
        self.pool, self.name, self.nbytes, self.log = pool, name, nbytes, log
        self.arena = None

    def take(self) -> None:
        self.arena = self.pool.acquire(self, self.nbytes, pin=False)

    def yield_bounce(self) -> None:
        self.log.append(f"{self.name} yields")
        self.arena = None

    def resume_bounce(self) -> None:
        self.log.append(f"{self.name} resumes")
        self.take()


def test_readers_take_turns_in_one_arena_of_the_larger_size() -> None:
    base = arena_bytes_held()
    pool, log = BouncePool(), []
    dit, encoder = Reader(pool, "dit", 1 << 20, log), Reader(pool, "encoder", 3 << 20, log)
    dit.take()
    first = dit.arena
    assert first is not None and first.nbytes == 1 << 20
    encoder.take()  # the text phase: the DiT's idle ring is taken, and grown to the encoder's size
    assert log == ["dit yields"] and dit.arena is None and pool.holder is encoder
    assert encoder.arena is not None and encoder.arena.nbytes == 3 << 20 and first.closed
    assert arena_bytes_held() - base == 3 << 20  # one arena, never one each
    pool.release(encoder)  # the stage ends: the DiT gets it back at once and reads ahead
    assert log == ["dit yields", "dit resumes"] and pool.holder is dit and dit.arena is encoder.arena
    assert pool.waiting is False
    encoder.take()
    assert pool.waiting  # the DiT waits for it again
    pool.release(encoder, done=True)
    pool.release(dit, done=True)
    assert pool.arena is None and arena_bytes_held() == base  # nobody may want it: freed


def test_an_idle_arena_stays_for_a_reader_that_will_want_it_again() -> None:
    base = arena_bytes_held()
    pool, log = BouncePool(), []
    encoder = Reader(pool, "encoder", 1 << 20, log)
    encoder.take()
    arena = encoder.arena
    pool.release(encoder)  # between prompts, nobody waiting: kept for the next stage
    assert pool.arena is arena and not arena.closed and pool.holder is None
    encoder.take()
    assert encoder.arena is arena  # the same memory, not allocated again
    pool.close()  # the load is undone
    assert arena.closed and arena_bytes_held() == base and log == []
