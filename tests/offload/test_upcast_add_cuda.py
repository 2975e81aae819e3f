"""offload/upcast_add.py on a GPU: the fused fp8 upcast + LoRA delta writes the bits of the two steps it
replaces (`out.copy_(fp8); out += delta`) for every value class, and runs as one kernel on sm_89 and later."""

from __future__ import annotations

import pytest
import torch

from omni_console.offload import upcast_add as fused

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

DEV = torch.device("cuda", 0)


def values(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Normal values at many scales, exact zeros, ties, tiny and large magnitudes."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    scale = torch.exp2(torch.randint(-30, 12, (n,), generator=g).float())
    x = torch.randn(n, generator=g) * scale
    x[::97] = 0.0
    return x.to(dtype).to(DEV)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("delta_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("n", [1, 2047, 2048, 3 * 2048 + 5, 1 << 20])
def test_fused_equals_the_two_steps(out_dtype: torch.dtype, delta_dtype: torch.dtype, fp8: torch.dtype, n: int):
    src = (values(n, torch.float32, n) / 64).to(fp8)
    delta = values(n, delta_dtype, n + 1)
    if out_dtype == torch.float16:
        delta = delta.clamp(-60000, 60000)
    expected = torch.empty(n, dtype=out_dtype, device=DEV)
    expected.copy_(src)
    expected += delta
    got = torch.full((n,), float("nan"), dtype=out_dtype, device=DEV)
    ran = fused.upcast_add(src, delta, got)
    same_kind = delta_dtype in (out_dtype, torch.float32)  # a bfloat16 delta into float16 takes the two steps
    assert ran == (same_kind and torch.cuda.get_device_capability(DEV) >= (8, 9) and fused._kernel is not None)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))


def test_the_kernel_runs_on_an_h100_or_later():
    if torch.cuda.get_device_capability(DEV) < (9, 0):
        pytest.skip("checks the H100/H200 the benchmarks use")
    src = torch.randn(4096, device=DEV).to(torch.float8_e4m3fn)
    assert fused.upcast_add(src, torch.randn(4096, device=DEV, dtype=torch.bfloat16),
                            torch.empty(4096, device=DEV, dtype=torch.bfloat16))


def test_a_non_contiguous_delta_takes_the_two_steps_with_the_same_bits():
    src = torch.randn(64, 32, device=DEV).to(torch.float8_e4m3fn)
    delta = torch.randn(32, 64, device=DEV, dtype=torch.bfloat16).T  # fan_in_fan_out's transposed B·A
    expected = src.to(torch.bfloat16) + delta
    got = torch.empty(64, 32, device=DEV, dtype=torch.bfloat16)
    assert not fused.upcast_add(src, delta, got)
    assert torch.equal(got, expected)
