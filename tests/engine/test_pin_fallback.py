"""A host that refuses to page-lock part of the streamed blocks: the load keeps the blocks that locked, reads
the refused ones from the page cache (their arena pages given back), says so in one line, and draws what plain
diffusers draws. There is no driver on a CPU: a page-locker double refuses past a byte allowance, as a driver
out of lockable memory does (`EngineOptions.page_locker`)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from test_tier_reads import POLICIES, REQUEST, engine_output, plain_output

from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.offload.events import LogEvent, StagingEvent
from omni_console.offload.pinned import PAGE

REFUSED = "cudaHostRegister failed: cudaErrorMemoryAllocation"


class RefusingLocker:
    """Locks (nothing to do on a CPU) the first `allow` ranges it is asked for; refuses every later one."""

    def __init__(self, allow: int) -> None:
        self.allow = allow
        self.asked = 0
        self.locked: dict[int, int] = {}
        self._lock = threading.Lock()

    def register(self, ptr: int, nbytes: int) -> str | None:
        with self._lock:
            self.asked += 1
            if self.asked > self.allow:
                return REFUSED
            self.locked[ptr] = nbytes
        return None

    def unregister(self, ptr: int) -> None:
        with self._lock:
            del self.locked[ptr]


@pytest.mark.slow
def test_refused_page_locks_read_the_rest_from_the_page_cache_bit_identical(demo_model_dir: Path):
    expected = plain_output(demo_model_dir, REQUEST)
    for policy in POLICIES:
        locker = RefusingLocker(2)
        engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(page_locker=locker))
        events = engine.bus.subscribe()
        try:
            report = engine.load(policy())
            s = engine.placement.streamer
            fallback = s.pin_fallback
            assert fallback is not None and fallback.blocks > 0 and fallback.kept == 0, policy
            assert fallback.pinned_blocks + fallback.blocks == s.num_streamed
            by_tier = s.tier_bytes()
            assert by_tier["page_cache"] == fallback.nbytes > 0 and by_tier["pinned"] > 0
            assert by_tier["disk"] == 0
            arena = s.filler.arena
            assert arena is not None and arena.held_bytes <= arena.nbytes - fallback.released
            assert fallback.released > 0  # the refused blocks' pages went back to the kernel
            assert report.pin_fallback_blocks == fallback.blocks and report.pin_fallback_bytes == fallback.nbytes
            assert len(locker.locked) == fallback.pinned_blocks == 2
            result = engine.generate(REQUEST, threading.Event())
            engine.unload()
            assert locker.locked == {}  # every registration undone at unload
            got = engine_output(result)
            assert np.array_equal(got.reshape(expected.shape), expected), policy
        finally:
            engine.close()
        seen = events.drain()
        lines = [e.message for e in seen if isinstance(e, LogEvent) and "page-locking stopped" in e.message]
        assert len(lines) == 1 and REFUSED in lines[0] and "read from the page cache instead" in lines[0]
        tiers = {e.tier for e in seen if isinstance(e, StagingEvent) and e.target.startswith("transformer.")}
        assert tiers == {"pinned", "page_cache"}


@pytest.mark.slow
def test_a_host_that_locks_nothing_reads_every_streamed_block_from_the_page_cache(demo_model_dir: Path):
    expected = plain_output(demo_model_dir, REQUEST)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(page_locker=RefusingLocker(0)))
    try:
        engine.load(POLICIES[0]())
        s = engine.placement.streamer
        assert s.pin_fallback is not None and s.pin_fallback.pinned_blocks == 0
        assert s.tier_bytes()["pinned"] == 0 and s.pinned_bytes == 0
        got = engine_output(engine.generate(REQUEST, threading.Event()))
        assert np.array_equal(got.reshape(expected.shape), expected)
    finally:
        engine.close()


@pytest.mark.slow
def test_a_host_that_locks_everything_falls_back_nowhere(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(page_locker=RefusingLocker(1 << 40)))
    try:
        report = engine.load(POLICIES[0]())
        s = engine.placement.streamer
        assert s.pin_fallback is None and s.bounce_bytes == 0 and s.tier_bytes()["page_cache"] == 0
        assert report.pin_fallback_blocks == 0 and s.pinned_bytes > 0
        assert 0 <= s.host_bytes - s.pinned_bytes < PAGE * s.num_streamed  # every region locked, page gaps aside
    finally:
        engine.close()
