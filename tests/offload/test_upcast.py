"""fp8 storage in the streamer: 8-bit bytes in the arena and the slots, compute-dtype weights when a
block runs, exact against weights upcast by hand; a file's tensor re-typed to fp8 before it is read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from omni_console.offload.deferred_weights import DeferredWeights, Source
from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer

FP8 = torch.float8_e4m3fn


def _blocks(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16))
                                 for _ in range(5)]).eval()


def _store_linears_in_fp8(model: torch.nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.to(dtype=FP8)


def _reference(x: torch.Tensor) -> torch.Tensor:
    """The same model with its linears rounded through fp8 and computed in float32."""
    model = _blocks()
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.to(dtype=FP8).to(dtype=torch.float32)
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("resident,keep_masters,slots", [
    ((False,) * 5, False, 2), ((True, False, True, False, False), False, 2),
    ((True, False, True, False, False), True, 3), ((False,) * 5, False, 5),
])
def test_fp8_blocks_compute_in_the_compute_dtype_and_match(resident, keep_masters, slots) -> None:
    x = torch.randn(3, 16)
    expected = _reference(x)
    model = _blocks()
    _store_linears_in_fp8(model)
    seen: list[torch.dtype] = []
    for block in model:
        block[0].register_forward_pre_hook(lambda m, a: seen.append(m.weight.dtype))
    streamer = LayerwiseStreamer([("blocks", list(model))], "cpu", keep_masters=keep_masters,
                                 residency=BlockResidency(resident, slots, "leading"), compute_dtype=torch.float32)
    streamer.attach()
    packed = [b for b in streamer._blocks if b.packed]
    assert packed and all(x.dtype == FP8 for b in packed for x in b.bindings if x.shape == (16, 16))
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(x), expected)
    assert set(seen) == {torch.float32}
    # between forwards every block's linear is 8-bit again: resident ones too (upcast per forward)
    assert {block[0].weight.dtype for block, r in zip(model, resident, strict=True) if r} <= {FP8}
    # the arena holds the linears' weights in one byte each
    assert streamer.host_bytes < sum(b.region_nbytes for b in packed) + 1
    assert all(b.tensor_bytes < 16 * 16 * 4 for b in packed)
    streamer.detach()


def test_a_retyped_tensor_is_read_as_its_load_dtype_then_cast(tmp_path: Path) -> None:
    """float32 file, bfloat16 load dtype, fp8 storage: rounded twice, as a load then `module.to(fp8)` does."""
    values = torch.randn(64, generator=torch.Generator().manual_seed(0)) * 3
    once = values.to(FP8).view(torch.uint8)
    path = tmp_path / "w.bin"
    path.write_bytes(values.numpy().tobytes())
    weights = DeferredWeights(threads=2)
    weights.own_fd(fd := os.open(path, os.O_RDONLY))
    t = torch.nn.Parameter(torch.empty(64, dtype=torch.bfloat16), requires_grad=False)
    weights.add(t, Source(fd, 0, 256, torch.float32, (64,)))
    weights.retype(t, FP8)
    assert t.dtype == FP8 and weights.knows(t)
    weights.materialize([t])
    twice = values.to(torch.bfloat16).to(FP8).view(torch.uint8)
    assert torch.equal(t.view(torch.uint8), twice) and not torch.equal(twice, once)
    with pytest.raises(ValueError, match="waiting"):
        weights.retype(t, torch.float8_e5m2)
    weights.close()
