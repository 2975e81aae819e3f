"""Resident fp8 blocks kept upcast (`BlockResidency.upcast`): which blocks, converted once at attach (no
per-forward upcast, exact), their bytes counted at the compute dtype, kept through a reorder and a re-plan."""

from __future__ import annotations

import pytest
import torch
from test_upcast import _blocks, _reference, _store_linears_in_fp8

from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer

FP8 = torch.float8_e4m3fn


def test_the_first_resident_blocks_in_execution_order_are_kept_upcast() -> None:
    spread = BlockResidency.spread(7, 3, 2)
    kept = spread.with_upcast(2)
    firsts = [i for i, r in enumerate(spread.resident) if r][:2]
    assert [i for i, u in enumerate(kept.upcast_flags) if u] == firsts
    assert spread.with_upcast(9).num_upcast == 3  # more than resident: every resident block
    assert spread.with_upcast(0) == spread  # none kept: the same residency as never saying it
    with pytest.raises(ValueError, match="resident blocks only"):
        BlockResidency((True, False), 1, upcast=(False, True))


def _held_bytes(module: torch.nn.Module) -> int:
    """Bytes of the distinct storages under a module's tensors (a view of a larger copy holds all of it)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in module.parameters()}
    return sum(storages.values())


def _linear_dtypes(model: torch.nn.Sequential) -> list[torch.dtype]:
    return [block[0].weight.dtype for block in model]


@pytest.mark.parametrize("keep_masters", [False, True])
def test_kept_blocks_are_converted_once_and_compute_the_same(keep_masters: bool) -> None:
    x = torch.randn(3, 16)
    expected = _reference(x)
    model = _blocks()
    _store_linears_in_fp8(model)
    residency = BlockResidency((True, False, True, True, False), 2).with_upcast(2)  # blocks 0 and 2
    streamer = LayerwiseStreamer([("blocks", list(model))], "cpu", keep_masters=keep_masters, residency=residency,
                                 compute_dtype=torch.float32)
    plain = LayerwiseStreamer([("blocks", list(_stored()))], "cpu", keep_masters=keep_masters,
                              residency=BlockResidency(residency.resident, 2), compute_dtype=torch.float32)
    streamer.attach()
    plain.attach()
    # between forwards: the kept ones already in float32, the other resident one still fp8
    assert _linear_dtypes(model)[:4] == [torch.float32, FP8, torch.float32, FP8]
    # each kept linear's weight and bias: 16 x 16 + 16 fp8 elements become float32 (3 more bytes each)
    assert streamer.resident_bytes - plain.resident_bytes == 2 * (16 * 16 + 16) * 3
    # and that is what they hold: no tensor of a kept block still views its fp8 device copy
    assert [_held_bytes(model[i]) for i in (0, 2)] == [(16 * 16 + 16) * 4 + 2 * 16 * 4] * 2
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(x), expected)
    assert [_linear_dtypes(model)[i] for i in (0, 2, 3)] == [torch.float32, torch.float32, FP8]  # the resident ones
    if keep_masters:  # a re-plan moves the upcast to block 3 (block 0 back to fp8), and a reorder keeps it
        streamer.replan(BlockResidency((True, False, False, True, False), 2).with_upcast(2))
        assert _linear_dtypes(model)[0:4:3] == [torch.float32, torch.float32]
        with torch.no_grad():
            assert torch.equal(model(x), expected)
        streamer.replan(BlockResidency((True, False, False, True, False), 2))
        # two resident blocks, both fp8 again: two thirds of the three fp8 blocks' bytes
        assert _linear_dtypes(model)[0] == FP8 and streamer.resident_bytes == plain.resident_bytes * 2 // 3
    names = streamer.block_names
    before = {n for n, u in zip(names, streamer.residency.upcast_flags, strict=True) if u}
    after = streamer.reorder([names[3], *names[:3], names[4]])  # each block keeps its residency and upcast
    assert {n for n, u in zip(streamer.block_names, after.upcast_flags, strict=True) if u} == before
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    streamer.detach()
    plain.detach()


def _stored() -> torch.nn.Sequential:
    model = _blocks()
    _store_linears_in_fp8(model)
    return model


def _one_storage(module: torch.nn.Module) -> None:
    """Put every parameter of `module` on one storage (as a span moved whole to the device leaves them)."""
    params = list(module.parameters())
    offsets, end = [], 0
    for p in params:
        offsets.append(end)
        end += -(-p.nbytes // 64) * 64
    flat = torch.empty(end, dtype=torch.uint8)
    for p, at in zip(params, offsets, strict=True):
        view = flat[at : at + p.nbytes].view(p.dtype).view(p.shape)
        view.copy_(p.detach())
        p.data = view


def test_a_kept_block_moved_whole_holds_only_its_compute_dtype_bytes() -> None:
    x = torch.randn(3, 16)
    expected = _reference(x)
    model = _stored()
    for block in model:
        _one_storage(block)
    shared = model[0][1].weight.untyped_storage().nbytes()  # the LayerNorm's weight views the block's one storage
    residency = BlockResidency((True, False, True, False, False), 2).with_upcast(1)  # block 0 kept, block 2 not
    streamer = LayerwiseStreamer([("blocks", list(model))], "cpu", keep_masters=False, residency=residency,
                                 compute_dtype=torch.float32)
    streamer.attach()
    assert _held_bytes(model[0]) == (16 * 16 + 16) * 4 + 2 * 16 * 4  # the one storage (fp8 bytes too) is freed
    assert _held_bytes(model[2]) == shared  # not kept: its fp8 bytes stay where they are, converted at each forward
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    streamer.detach()
