"""Exact-size host arenas (pin accounting, failure fallback) and typed views over their bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omni_console.offload.pinned import (
    HostArena,
    is_dense,
    pinned_bytes_held,
    typed_view,
)


class FakeCudart:
    """Stands in for torch.cuda.cudart() so registration bookkeeping is testable without a GPU."""

    def __init__(self, rc: int = 0) -> None:
        self.rc = rc
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[int] = []

    def cudaHostRegister(self, ptr: int, n: int, flags: int) -> int:  # noqa: N802 - CUDA's name
        self.registered.append((ptr, n, flags))
        return self.rc

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        self.unregistered.append(ptr)
        return 0


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch):
    def install(rc: int = 0) -> FakeCudart:
        fake = FakeCudart(rc)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
        return fake

    return install


def test_arena_is_exactly_the_requested_size_and_unpinned_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = pinned_bytes_held()
    arena = HostArena(3 * 1024 * 1024 + 17, pin=True)
    assert arena.nbytes == 3 * 1024 * 1024 + 17
    assert arena.tensor.numel() == arena.nbytes and arena.tensor.dtype == torch.uint8
    assert arena.tensor.device.type == "cpu"
    assert not arena.pinned
    assert arena.pin_failure_reason == "CUDA is not available"
    assert pinned_bytes_held() == before
    arena.close()
    arena.close()  # idempotent
    assert arena.closed
    with pytest.raises(RuntimeError, match="closed"):
        _ = arena.tensor


def test_unpinned_arena_has_no_failure_reason():
    arena = HostArena(10, pin=False)
    assert not arena.pinned and arena.pin_failure_reason is None
    arena.close()


def test_negative_size_rejected():
    with pytest.raises(ValueError):
        HostArena(-1, pin=False)


def test_registration_is_counted_and_released(fake_cuda):
    fake = fake_cuda(rc=0)
    before = pinned_bytes_held()
    arena = HostArena(1000, pin=True)
    assert arena.pinned and arena.pin_failure_reason is None
    assert fake.registered == [(arena.tensor.data_ptr(), 1000, 0)]  # exact size, default flags
    assert pinned_bytes_held() == before + 1000
    other = HostArena(24, pin=True)
    assert pinned_bytes_held() == before + 1024
    ptr = arena.tensor.data_ptr()
    arena.close()
    arena.close()
    assert fake.unregistered == [ptr]  # once, even when closed twice
    assert pinned_bytes_held() == before + 24
    del other  # __del__ releases too
    assert pinned_bytes_held() == before


def test_registration_failure_falls_back_to_pageable(fake_cuda):
    fake = fake_cuda(rc=2)
    before = pinned_bytes_held()
    arena = HostArena(512, pin=True)
    assert not arena.pinned
    assert "cudaHostRegister failed" in (arena.pin_failure_reason or "")
    assert pinned_bytes_held() == before
    arena.close()
    assert fake.unregistered == []


def test_is_dense_recognises_permutations_but_not_gaps():
    x = torch.randn(4, 6)
    assert is_dense(x) and is_dense(x.t()) and is_dense(torch.randn(2, 3, 4).permute(2, 0, 1))
    assert not is_dense(torch.randn(4, 12)[:, ::2])
    assert is_dense(torch.randn(8, 6)[2:4])


def test_typed_view_reads_a_strided_tensor_back_from_its_bytes():
    """The streamer re-points weights at typed views of its arena: dtype, shape and strides survive."""
    transposed = torch.randn(9, 7).t()
    buf = torch.zeros(256 + 9 * 7 * 4, dtype=torch.uint8)
    storage = torch.empty(0).set_(transposed.untyped_storage()).view(torch.uint8)
    buf[256 : 256 + storage.numel()].copy_(storage)
    view = typed_view(buf, 256, transposed.dtype, transposed.shape, transposed.stride())
    assert view.stride() == transposed.stride() and torch.equal(view, transposed)
    assert view.data_ptr() == buf.data_ptr() + 256


def test_typed_view_rejects_misaligned_offsets():
    buf = torch.zeros(64, dtype=torch.uint8)
    with pytest.raises(ValueError, match="aligned"):
        typed_view(buf, 2, torch.float32, (2,), (1,))


def test_pin_after_filling_keeps_contents_and_says_why_it_cannot_pin_here():
    arena = HostArena(64, pin=False)
    arena.tensor.copy_(torch.arange(64, dtype=torch.uint8))
    assert arena.pin() is torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert arena.pin_failure_reason == "CUDA is not available"
    assert torch.equal(arena.tensor, torch.arange(64, dtype=torch.uint8))
    arena.close()


def test_ranges_registered_from_several_threads_undo_every_one_when_one_fails(fake_cuda):
    from concurrent.futures import ThreadPoolExecutor

    from omni_console.offload.pinned import PAGE

    fake = fake_cuda(rc=0)
    fails_at = 5

    def register(ptr: int, n: int, flags: int) -> int:
        fake.registered.append((ptr, n, flags))
        return 2 if len(fake.registered) == fails_at else 0

    fake.cudaHostRegister = register
    before = pinned_bytes_held()
    arena = HostArena(16 * PAGE, pin=False)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: arena.pin_ranges([(i * PAGE, (i + 1) * PAGE)]), range(16)))
    assert not arena.pinned and "cudaHostRegister failed" in (arena.pin_failure_reason or "")
    succeeded = [ptr for i, (ptr, _, _) in enumerate(fake.registered, 1) if i != fails_at]
    assert sorted(fake.unregistered) == sorted(succeeded)  # every registration that took is undone, once
    assert pinned_bytes_held() == before
    arena.close()


def test_a_large_arena_is_advised_to_use_huge_pages_and_stays_exact(monkeypatch):
    from omni_console.offload import pinned
    from omni_console.offload.pinned import HUGE_PAGE

    monkeypatch.setattr(pinned, "_free_bytes", lambda: 64 << 30)
    arena = HostArena(3 * HUGE_PAGE + 5, pin=False)
    assert arena.nbytes == arena.tensor.numel() == 3 * HUGE_PAGE + 5
    thp_kernel = Path("/sys/kernel/mm/transparent_hugepage/enabled").exists()
    assert arena.tensor.data_ptr() % HUGE_PAGE == 0 and arena.huge_pages is thp_kernel
    arena.tensor.fill_(7)
    view = arena.tensor[-5:]
    arena.close()
    assert view.tolist() == [7] * 5  # a view outliving the arena keeps the mapping alive
    small = HostArena(100, pin=False)
    assert not small.huge_pages and small.tensor.data_ptr() % 4096 == 0
    small.close()


def test_huge_pages_are_not_asked_for_when_free_memory_is_short(monkeypatch):
    """With RAM full of page cache, a huge-page fault would reclaim and compact on the spot: 4 KiB pages then."""
    from omni_console.offload import pinned
    from omni_console.offload.pinned import HUGE_PAGE

    monkeypatch.setattr(pinned, "_free_bytes", lambda: 3 * HUGE_PAGE + pinned.SPARE)  # not more than needed
    arena = HostArena(3 * HUGE_PAGE, pin=False)
    assert not arena.huge_pages and arena.tensor.data_ptr() % 4096 == 0
    arena.tensor.fill_(1)
    assert int(arena.tensor.sum()) == 3 * HUGE_PAGE
    arena.close()


class CountingLocker:
    """A page-locker double: locks the first `allow` ranges, refuses the rest (a driver out of lockable memory)."""

    def __init__(self, allow: int) -> None:
        self.allow = allow
        self.asked: list[tuple[int, int]] = []
        self.unregistered: list[int] = []

    def register(self, ptr: int, nbytes: int) -> str | None:
        self.asked.append((ptr, nbytes))
        return None if len(self.asked) <= self.allow else "cudaHostRegister failed: cudaErrorMemoryAllocation"

    def unregister(self, ptr: int) -> None:
        self.unregistered.append(ptr)


def test_a_partial_arena_keeps_the_ranges_that_locked_and_lists_the_rest():
    from omni_console.offload.pinned import PAGE, arena_bytes_held

    locker = CountingLocker(allow=2)
    before, held = pinned_bytes_held(), arena_bytes_held()
    arena = HostArena(6 * PAGE, pin=False, locker=locker, partial=True)
    arena.tensor.fill_(7)
    ranges = [(i * PAGE, (i + 1) * PAGE) for i in range(6)]
    assert not arena.pin_ranges(ranges[:3])  # the third is refused
    assert not arena.pin_ranges(ranges[3:])
    assert len(locker.asked) == 3  # after a refusal nothing more is asked of the driver
    assert arena.pinned_bytes == 2 * PAGE and pinned_bytes_held() == before + 2 * PAGE
    assert arena.unpinned_ranges == ranges[2:] and "cudaErrorMemoryAllocation" in (arena.pin_failure_reason or "")
    for lo, hi in ranges[2:]:
        assert arena.release_range(lo, hi) == PAGE
    assert arena.pinned and arena.held_bytes == 2 * PAGE  # every range still holding bytes is locked
    assert arena_bytes_held() == held + 2 * PAGE
    assert torch.all(arena.tensor[: 2 * PAGE] == 7)  # the locked ranges keep their bytes
    with pytest.raises(ValueError, match="not an unpinned range"):
        arena.release_range(*ranges[0])
    arena.close()
    assert len(locker.unregistered) == 2 and pinned_bytes_held() == before and arena_bytes_held() == held


def test_without_partial_one_refusal_still_undoes_every_range():
    from omni_console.offload.pinned import PAGE

    locker = CountingLocker(allow=2)
    arena = HostArena(4 * PAGE, pin=False, locker=locker)
    assert not arena.pin_ranges([(i * PAGE, (i + 1) * PAGE) for i in range(4)])
    assert arena.pinned_bytes == 0 and len(locker.unregistered) == 2 and arena.unpinned_ranges == []
    arena.close()
