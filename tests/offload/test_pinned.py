"""Exact-size host arenas (pin accounting, failure fallback) and the aligned packing layout."""

from __future__ import annotations

import pytest
import torch

from omni_console.offload import pinned
from omni_console.offload.pinned import (
    ALIGNMENT,
    HostArena,
    is_dense,
    pack_into_arena,
    pack_tensor,
    pinned_bytes_held,
    plan_packing,
    typed_view,
    unpack_view,
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


def test_layout_offsets_are_aligned_and_total_is_tight():
    tensors = [torch.randn(3), torch.randn(64, 64), torch.randn(5, dtype=torch.float64).to(torch.bfloat16)]
    entries, total = plan_packing(tensors)
    assert [e.offset % ALIGNMENT for e in entries] == [0, 0, 0]
    assert [e.nbytes for e in entries] == [12, 64 * 64 * 4, 10]
    assert entries[1].offset == 256 and entries[2].offset == 256 + 64 * 64 * 4
    assert total == entries[2].offset + 256


def test_layout_keeps_dense_strides_and_makes_gappy_tensors_contiguous():
    transposed = torch.randn(8, 16).t()
    gappy = torch.randn(8, 32)[:, ::4]
    entries, _ = plan_packing([transposed, gappy])
    assert entries[0].stride == transposed.stride() and entries[0].nbytes == 8 * 16 * 4
    assert entries[1].stride == (8, 1) and entries[1].nbytes == 8 * 8 * 4


def test_pack_and_view_back_roundtrip_mixed_dtypes():
    tensors = [
        torch.randn(7, 9),
        torch.randn(9, 7).t(),
        torch.randn(5, 10, dtype=torch.bfloat16)[:, ::2],
        torch.arange(11, dtype=torch.int64),
        torch.tensor([True, False, True]),
        torch.randn(4, dtype=torch.complex64),
    ]
    arena, entries = pack_into_arena(tensors, pin=False)
    for t, e in zip(tensors, entries, strict=True):
        view = unpack_view(arena.tensor, e)
        assert view.dtype == t.dtype and view.shape == t.shape
        assert torch.equal(view, t)
        assert view.data_ptr() == arena.tensor.data_ptr() + e.offset
    assert torch.equal(unpack_view(arena.tensor, entries[1]), tensors[1])
    assert unpack_view(arena.tensor, entries[1]).stride() == tensors[1].stride()
    arena.close()


def test_pack_tensor_writes_only_its_bytes():
    buf = torch.zeros(1024, dtype=torch.uint8)
    entries, _ = plan_packing([torch.ones(4), torch.ones(4)])
    pack_tensor(buf, entries[1], torch.full((4,), 2.0))
    assert torch.equal(unpack_view(buf, entries[0]), torch.zeros(4))
    assert torch.equal(unpack_view(buf, entries[1]), torch.full((4,), 2.0))


def test_typed_view_rejects_misaligned_offsets():
    buf = torch.zeros(64, dtype=torch.uint8)
    with pytest.raises(ValueError, match="aligned"):
        typed_view(buf, 2, torch.float32, (2,), (1,))


def test_module_exports_counter():
    assert pinned.pinned_bytes_held() >= 0


def test_pin_after_filling_keeps_contents_and_says_why_it_cannot_pin_here():
    arena = HostArena(64, pin=False)
    arena.tensor.copy_(torch.arange(64, dtype=torch.uint8))
    assert arena.pin() is torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert arena.pin_failure_reason == "CUDA is not available"
    assert torch.equal(arena.tensor, torch.arange(64, dtype=torch.uint8))
    arena.close()
