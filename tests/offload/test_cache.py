"""AllocatorCache: the 25 % cached / 5 % free rule, its boundaries, telemetry failure, forced, CPU."""

from __future__ import annotations

import pytest

from omni_console.offload.cache import AllocatorCache, MemoryReading, format_bytes
from omni_console.offload.events import CacheDecision, EventBus

GB = 10**9


def make(reading: MemoryReading | Exception, **kw) -> tuple[AllocatorCache, list[int], object]:
    bus = EventBus()
    sub = bus.subscribe()
    emptied: list[int] = []

    def read() -> MemoryReading:
        if isinstance(reading, Exception):
            raise reading
        return reading

    cache = AllocatorCache("cuda:0", bus=bus, read_memory=read, empty_cache=lambda: emptied.append(1), **kw)
    return cache, emptied, sub


def decision(sub) -> CacheDecision:
    events = [e for e in sub.drain() if isinstance(e, CacheDecision)]
    assert len(events) == 1, "every call publishes exactly one decision"
    return events[0]


def test_within_bounds_retains_and_reports_the_numbers():
    cache, emptied, sub = make(MemoryReading(reserved=30 * GB, allocated=20 * GB, free=40 * GB, total=80 * GB))
    assert cache.release_if_needed(context="after offloading vae") is False
    assert emptied == []
    d = decision(sub)
    assert (d.action, d.reason, d.forced, d.context) == ("retain", "within bounds", False, "after offloading vae")
    assert (d.reserved, d.allocated, d.cached, d.free, d.total) == (30 * GB, 20 * GB, 10 * GB, 40 * GB, 80 * GB)


def test_too_much_cached_releases():
    cache, emptied, sub = make(MemoryReading(reserved=41 * GB, allocated=20 * GB, free=30 * GB, total=80 * GB))
    assert cache.release_if_needed() is True
    assert emptied == [1]
    d = decision(sub)
    assert d.action == "release" and d.reason == "cached 21.0 GB > 25% of 80.0 GB"


@pytest.mark.parametrize(("cached", "released"), [(250, False), (251, True)])
def test_cached_boundary_is_strict(cached, released):
    cache, emptied, sub = make(MemoryReading(reserved=cached + 100, allocated=100, free=500, total=1000))
    assert cache.release_if_needed() is released
    assert emptied == ([1] if released else [])
    assert decision(sub).action == ("release" if released else "retain")


def test_low_free_memory_releases():
    cache, emptied, sub = make(MemoryReading(reserved=10 * GB, allocated=10 * GB, free=2 * GB, total=80 * GB))
    assert cache.release_if_needed() is True and emptied == [1]
    assert decision(sub).reason == "free 2.0 GB < 5% of 80.0 GB"


@pytest.mark.parametrize(("free", "released"), [(50, False), (49, True)])
def test_free_boundary_is_strict(free, released):
    cache, _, sub = make(MemoryReading(reserved=100, allocated=100, free=free, total=1000))
    assert cache.release_if_needed() is released
    assert decision(sub).action == ("release" if released else "retain")


def test_both_reasons_are_named():
    cache, _, sub = make(MemoryReading(reserved=60 * GB, allocated=30 * GB, free=1 * GB, total=80 * GB))
    assert cache.release_if_needed()
    reason = decision(sub).reason
    assert "cached 30.0 GB > 25% of 80.0 GB" in reason and "free 1.0 GB < 5% of 80.0 GB" in reason


def test_allocated_above_reserved_counts_as_nothing_cached():
    cache, _, sub = make(MemoryReading(reserved=10, allocated=20, free=500, total=1000))
    assert not cache.release_if_needed()
    assert decision(sub).cached == 0


def test_unreadable_telemetry_releases_and_says_why():
    cache, emptied, sub = make(RuntimeError("NVML gone"))
    assert cache.release_if_needed() is True and emptied == [1]
    d = decision(sub)
    assert d.action == "release" and d.reason == "telemetry unavailable: RuntimeError: NVML gone"
    assert d.total is None and d.cached is None


def test_forced_release_even_within_bounds():
    cache, emptied, sub = make(MemoryReading(reserved=10, allocated=10, free=900, total=1000))
    assert cache.release_if_needed(force=True, context="failed loading vae") is True
    assert emptied == [1]
    d = decision(sub)
    assert (d.action, d.reason, d.forced, d.context) == ("release", "forced after failure", True, "failed loading vae")
    assert d.total == 1000  # numbers still reported


def test_forced_release_when_telemetry_fails_too():
    cache, emptied, sub = make(OSError("no driver"))
    assert cache.release_if_needed(force=True)
    assert emptied == [1] and decision(sub).reason == "forced after failure"


def test_custom_fractions():
    reading = MemoryReading(reserved=400, allocated=0, free=150, total=1000)
    cache, _, sub = make(reading, max_cached_fraction=0.5, min_free_fraction=0.1)
    assert not cache.release_if_needed()
    assert decision(sub).reason == "within bounds"
    cache, _, sub = make(reading, max_cached_fraction=0.3, min_free_fraction=0.2)
    assert cache.release_if_needed()
    assert decision(sub).reason == "cached 400 bytes > 30% of 1.0 kB; free 150 bytes < 20% of 1.0 kB"


@pytest.mark.parametrize("bad", [-0.01, 1.01])
@pytest.mark.parametrize("name", ["max_cached_fraction", "min_free_fraction"])
def test_fractions_must_be_in_unit_interval(name, bad):
    with pytest.raises(ValueError, match=name):
        AllocatorCache("cuda", **{name: bad})


def test_fraction_bounds_are_inclusive():
    """0 and 1 are accepted, and mean what they say: release on any cached byte / never for the rule."""
    full = MemoryReading(reserved=1000, allocated=0, free=0, total=1000)  # everything cached, nothing free
    never, emptied, _ = make(full, max_cached_fraction=1.0, min_free_fraction=0.0)
    assert never.release_if_needed() is False and emptied == []
    one_byte = MemoryReading(reserved=101, allocated=100, free=1000, total=1000)
    always, emptied, sub = make(one_byte, max_cached_fraction=0.0, min_free_fraction=0.0)
    assert always.release_if_needed() is True and emptied == [1]
    assert decision(sub).reason.startswith("cached 1 byte > 0%")


@pytest.mark.parametrize("force", [False, True])
def test_cpu_has_no_allocator_cache(force):
    bus = EventBus()
    sub = bus.subscribe()
    emptied: list[int] = []
    cache = AllocatorCache("cpu", bus=bus, empty_cache=lambda: emptied.append(1))
    assert cache.release_if_needed(force=force) is False
    assert emptied == []
    d = decision(sub)
    assert (d.action, d.reason, d.forced) == ("retain", "no device allocator (cpu)", force)


def test_release_counter():
    cache, _, _ = make(MemoryReading(reserved=900, allocated=0, free=10, total=1000))
    cache.release_if_needed()
    cache.release_if_needed()
    assert cache.releases == 2


def test_format_bytes():
    assert format_bytes(3.1e9) == "3.1 GB"
    assert format_bytes(512e6) == "512.0 MB"
    assert format_bytes(17) == "17 bytes"
