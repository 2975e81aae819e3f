"""offload/upcast_add.py without a GPU: the two-step path is the reference, and a fused kernel that rounds
otherwise on its first weight is turned off for good, its weight rewritten the two-step way."""

from __future__ import annotations

import pytest
import torch

from omni_console.offload import upcast_add as fused


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(fused, "_broken", False)
    monkeypatch.setattr(fused, "_checked", set())
    return monkeypatch


def operands(n: int = 4096) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    src = torch.randn(n, generator=g).to(torch.float8_e4m3fn)
    delta = (torch.randn(n, generator=g) * 1e-2).to(torch.bfloat16)
    return src, delta, src.to(torch.bfloat16) + delta


def test_on_a_cpu_the_two_steps_run(fresh):
    src, delta, expected = operands()
    out = torch.empty_like(expected)
    assert not fused.upcast_add(src, delta, out)
    assert torch.equal(out, expected)


def test_a_kernel_that_rounds_otherwise_is_turned_off_and_its_weight_redone(fresh):
    def truncating(src, delta, out):  # a fault: round toward zero instead of to nearest even
        wide = src.to(torch.float32) + delta.to(torch.float32)
        out.copy_((wide.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16))

    fresh.setattr(fused, "_fusable", lambda *_: True)
    fresh.setattr(fused, "_launch", truncating)
    src, delta, expected = operands()
    out = torch.empty_like(expected)
    assert not fused.upcast_add(src, delta, out)
    assert torch.equal(out, expected)
    assert fused._broken
    calls = []
    fresh.setattr(fused, "_launch", lambda *a: calls.append(a))
    fresh.setattr(fused, "_fusable", lambda *_: not fused._broken)
    assert not fused.upcast_add(src, delta, torch.empty_like(expected))
    assert not calls  # never launched again


def test_a_kernel_that_matches_is_checked_once_per_dtypes(fresh):
    launched = []

    def exact(src, delta, out):
        launched.append(out.dtype)
        fused._two_steps(src, delta, out)

    fresh.setattr(fused, "_fusable", lambda *_: True)
    fresh.setattr(fused, "_launch", exact)
    checks = []
    same = fused._same_bits
    fresh.setattr(fused, "_same_bits", lambda a, b: checks.append(1) or same(a, b))
    src, delta, expected = operands()
    for _ in range(3):
        out = torch.empty_like(expected)
        assert fused.upcast_add(src, delta, out)
        assert torch.equal(out, expected)
    assert len(launched) == 3 and len(checks) == 1
    assert fused.upcast_add(src, delta.to(torch.float16), torch.empty(4096, dtype=torch.float16))
    assert len(checks) == 2  # another combination of dtypes is checked on its first weight too


@pytest.mark.parametrize(("delta", "out", "fuses"), [
    (torch.bfloat16, torch.bfloat16, True),
    (torch.float16, torch.float16, True),
    (torch.float32, torch.bfloat16, True),
    (torch.float32, torch.float16, True),
    (torch.bfloat16, torch.float16, False),  # measured on an H100: CUDA's in-place add rounds this otherwise
    (torch.float16, torch.bfloat16, False),
    (torch.bfloat16, torch.float32, False),  # the kernel rounds into 16 bits only
])
def test_only_dtypes_whose_bits_the_kernel_gives_are_fused(delta, out, fuses):
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
        assert fused.dtypes_fuse(fp8, delta, out) is fuses
    assert not fused.dtypes_fuse(torch.bfloat16, delta, out)  # the source must be float8
