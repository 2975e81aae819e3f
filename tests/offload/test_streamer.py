"""LayerwiseStreamer on CPU: bit-exact outputs, the ring protocol, host memory, teardown."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from offload_toy_models import ToyModel, block_tensor_bytes

from omni_console.offload.events import EventBus, StagingEvent
from omni_console.offload.pinned import (
    align_up,
    contiguous_stride,
    is_dense,
    pinned_bytes_held,
    span_elements,
    typed_view,
)
from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer

DIM = 64
CASES = sorted({(n, r) for n in (1, 2, 3, 5) for r in (0, 1, n)})


def _input(seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, DIM, generator=g)


def _streamed(n: int, resident: int = 0, bus: EventBus | None = None, **kw) -> tuple[ToyModel, LayerwiseStreamer]:
    model = ToyModel(n, DIM)
    streamer = LayerwiseStreamer(model.block_lists(), "cpu", resident_layers=resident, bus=bus, **kw)
    streamer.attach()
    return model, streamer


def _staging(sub) -> list[StagingEvent]:
    return [e for e in sub.drain() if isinstance(e, StagingEvent)]


@pytest.mark.parametrize(("n", "resident"), CASES)
def test_outputs_bit_identical_to_plain_model_across_repeated_forwards(n, resident):
    reference = ToyModel(n, DIM)
    model, streamer = _streamed(n, resident)
    x = _input()
    with torch.no_grad():
        expected = reference(x)
        for _ in range(3):  # the ring wraps: step 2 and 3 start from the prefetched first block
            assert torch.equal(model(x), expected)
    assert all(all(b.aliased) for b in model.all_blocks())  # the aliasing buffer stayed a view
    assert streamer.num_streamed == n - resident and streamer.num_resident == resident
    streamer.detach()


def test_module_and_parameter_identities_never_change():
    model = ToyModel(3, DIM)
    modules = [id(m) for m in model.modules()]
    params = [id(p) for p in model.parameters()]
    # a buffer that is an autograd view (ToyBlock.row) is swapped once at attach for an aliasing
    # non-view tensor, so its base cannot keep the original host storage alive; others keep identity
    buffers = [id(b) for b in model.buffers() if not b._is_view()]
    streamer = LayerwiseStreamer(model.block_lists(), "cpu")
    streamer.attach()
    with torch.no_grad():
        model(_input())
        model(_input())
    assert [id(m) for m in model.modules()] == modules
    assert [id(p) for p in model.parameters()] == params
    assert [id(b) for b in model.buffers() if id(b) in set(buffers)] == buffers
    assert len(list(model.buffers())) == len(buffers) + 3
    assert all(isinstance(p, torch.nn.Parameter) for p in model.parameters())
    blk = model.blocks_a[0]
    assert blk.tied.weight is blk.proj.weight
    streamer.detach()


def test_block_tensors_become_placeholders_after_the_block_runs():
    model, streamer = _streamed(3)
    numel_after: dict[str, int] = {}

    def record(name):
        def hook(module, args, output):  # registered after the streamer's hook, so it runs after it
            numel_after[name] = sum(t.numel() for t in [*module.parameters(), *module.buffers()])

        return hook

    for i, blk in enumerate(model.all_blocks()):
        blk.register_forward_hook(record(f"b{i}"))
    with torch.no_grad():
        model(_input())
    assert numel_after == {"b0": 0, "b1": 0, "b2": 0}
    # the next forward's first two blocks are already back in the two slots
    assert [state for _, state, _ in streamer.block_states()] == ["device", "device", "host"]
    streamer.detach()


def test_resident_blocks_are_never_streamed():
    bus = EventBus()
    sub = bus.subscribe()
    model, streamer = _streamed(5, resident=2, bus=bus)
    with torch.no_grad():
        model(_input())
        model(_input())
    targets = {e.target for e in _staging(sub)}
    assert targets == {"blocks_a.2", "blocks_b.0", "blocks_b.1"}
    states = streamer.block_states()
    assert [s for _, s, _ in states[:2]] == ["resident", "resident"]
    streamer.detach()


def test_resident_bytes_and_sizes():
    reference = ToyModel(5, DIM)
    blocks = reference.all_blocks()
    model, streamer = _streamed(5, resident=2)
    assert streamer.resident_bytes == sum(block_tensor_bytes(b) for b in blocks[:2])
    streamed = sum(block_tensor_bytes(b) for b in blocks[2:])
    assert streamed <= streamer.streamed_bytes <= streamed * 1.01
    largest = max(block_tensor_bytes(b) for b in blocks[2:])
    assert largest <= streamer.largest_block_bytes <= 1.02 * largest
    assert streamer.slot_bytes == 2 * streamer.largest_block_bytes
    streamer.detach()


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 3, 5])
def test_host_arena_is_tight_and_original_tensors_are_released(n):
    model = ToyModel(n, DIM)
    expected = sum(block_tensor_bytes(b) for b in model.all_blocks())
    storages = [weakref.ref(t.untyped_storage()) for b in model.all_blocks() for t in [*b.parameters(), *b.buffers()]]
    streamer = LayerwiseStreamer(model.block_lists(), "cpu")
    streamer.attach()
    gc.collect()
    assert streamer.host_bytes <= 1.02 * expected
    assert streamer.pinned_bytes == 0  # CPU: nothing is page-locked
    assert all(ref() is None for ref in storages), "an original host copy of a streamed weight is still alive"
    streamer.detach()


def test_skipped_and_reordered_blocks_load_synchronously_and_stay_correct():
    bus = EventBus()
    sub = bus.subscribe()
    reference = ToyModel(5, DIM)
    model, streamer = _streamed(5, bus=bus)
    _staging(sub)
    x = _input()
    order = [0, 2, 1, 4, 3, 3, 0, 1]  # skip 1, go back, run a block twice in a row
    with torch.no_grad():
        h_ref, h = x, x
        for i in order:
            h_ref = reference.all_blocks()[i](h_ref)
            h = model.all_blocks()[i](h)
            assert torch.equal(h, h_ref)
    events = _staging(sub)
    sync_targets = [e.target for e in events if e.sync]
    assert "blocks_a.1" in sync_targets  # skipped, then needed after its slot was reused
    # a block run twice in a row is rebound from its slot without another copy
    assert all(e.nbytes > 0 and e.direction == "h2d" and e.seconds > 0 for e in events)
    streamer.detach()


def test_staging_events_and_step_stats_count_every_copy():
    bus = EventBus()
    sub = bus.subscribe()
    model, streamer = _streamed(5, bus=bus)
    regions = {name: nbytes for name, _, nbytes in streamer.block_states()}
    first = streamer.take_step_stats()  # attach warms the ring: block 0 at once, block 1 ahead of it
    assert first.transfers == 2 and first.h2d_bytes == regions["blocks_a.0"] + regions["blocks_a.1"] > 0
    events = _staging(sub)
    assert [(e.target, e.sync) for e in events] == [("blocks_a.0", True), ("blocks_a.1", False)]
    with torch.no_grad():
        model(_input())
    stats = streamer.take_step_stats()
    # blocks 2..4, then the wrap-around: block 0 and (from the last block's freed slot) block 1
    assert stats.transfers == 5
    events = _staging(sub)
    assert stats.stall_s == pytest.approx(sum(e.seconds for e in events))  # CPU: every copy is exposed
    assert [e.target for e in events] == ["blocks_a.2", "blocks_b.0", "blocks_b.1", "blocks_a.0", "blocks_a.1"]
    assert not any(e.sync for e in events)
    assert sum(e.nbytes for e in events) == stats.h2d_bytes
    with torch.no_grad():
        model(_input())
    assert streamer.take_step_stats().transfers == 5  # steady state: each block crosses once per forward
    assert [e.target for e in _staging(sub)] == ["blocks_a.2", "blocks_b.0", "blocks_b.1", "blocks_a.0", "blocks_a.1"]
    assert streamer.take_step_stats().transfers == 0  # totals reset at each call


def test_two_streamed_blocks_stay_in_the_slots_without_further_copies():
    model, streamer = _streamed(2)
    with torch.no_grad():
        model(_input())
        streamer.take_step_stats()
        model(_input())
    assert streamer.take_step_stats().transfers == 0
    streamer.detach()


def test_progress_reports_packed_bytes():
    model = ToyModel(3, DIM)
    calls: list[tuple[int, int]] = []
    streamer = LayerwiseStreamer(model.block_lists(), "cpu", progress=lambda d, t: calls.append((d, t)))
    streamer.attach()
    assert len(calls) == 3
    assert calls[-1][0] == calls[-1][1] > 0
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    streamer.detach()


def test_forward_under_inference_mode_keeps_parameters_normal():
    reference = ToyModel(3, DIM)
    model, streamer = _streamed(3)
    with torch.inference_mode():
        out = model(_input())
    with torch.no_grad():
        assert torch.equal(out, reference(_input()))
    assert not any(p.is_inference() for p in model.parameters())
    with torch.no_grad():  # still usable outside inference mode
        assert torch.equal(model(_input()), reference(_input()))
    streamer.detach()


def test_detach_releases_everything_and_is_idempotent():
    model, streamer = _streamed(3, resident=1)
    with torch.no_grad():
        model(_input())
    held = pinned_bytes_held()
    streamer.detach()
    streamer.detach()
    assert streamer.host_bytes == 0 and streamer.slot_bytes == 0
    assert pinned_bytes_held() == held
    for blk in model.all_blocks():
        assert not blk._forward_pre_hooks and not blk._forward_hooks
        assert all(t.numel() == 0 for t in [*blk.parameters(), *blk.buffers()])
    assert not streamer.attached
    with pytest.raises(RuntimeError, match="cannot attach again"):
        streamer.attach()


def test_all_resident_means_no_hooks_and_no_buffers():
    model, streamer = _streamed(3, resident=3)
    assert streamer.slot_bytes == 0 and streamer.host_bytes == 0
    assert all(not b._forward_pre_hooks for b in model.all_blocks())
    streamer.detach()


def test_resident_layers_out_of_range():
    model = ToyModel(3, DIM)
    for bad in (-1, 4):
        with pytest.raises(ValueError, match=r"resident_layers must be in \[0, 3\]"):
            LayerwiseStreamer(model.block_lists(), "cpu", resident_layers=bad)


def test_failed_attach_releases_buffers_and_keeps_weights():
    reference = ToyModel(3, DIM)
    model = ToyModel(3, DIM)

    def explode(done: int, total: int) -> None:
        if done < total:
            return
        raise RuntimeError("disk on fire")

    streamer = LayerwiseStreamer(model.block_lists(), "cpu", progress=explode)
    with pytest.raises(RuntimeError, match="disk on fire"):
        streamer.attach()
    assert not streamer.attached and streamer.slot_bytes == 0 and streamer.host_bytes == 0
    assert all(not b._forward_pre_hooks and not b._forward_hooks for b in model.all_blocks())
    with torch.no_grad():
        assert torch.equal(model(_input()), reference(_input()))
    streamer._progress = None  # the failure is gone: attaching again works
    streamer.attach()
    with torch.no_grad():
        assert torch.equal(model(_input()), reference(_input()))
    streamer.detach()


def test_weights_shared_between_blocks_are_rejected_before_anything_moves():
    reference = ToyModel(2, DIM)
    model = ToyModel(2, DIM)
    model.blocks_b[0].norm.weight = model.blocks_a[0].norm.weight
    reference.blocks_b[0].norm.weight = reference.blocks_a[0].norm.weight
    streamer = LayerwiseStreamer(model.block_lists(), "cpu")
    with pytest.raises(ValueError, match="shares weight storage"):
        streamer.attach()
    with torch.no_grad():
        assert torch.equal(model(_input()), reference(_input()))


def test_blocks_living_in_one_flat_storage_stream_separately():
    """Some loaders keep every weight in one big buffer: blocks must not be seen as sharing weights."""
    reference = ToyModel(3, DIM)
    model = ToyModel(3, DIM)
    params = [p for b in model.all_blocks() for p in b.parameters()]
    strides = [p.stride() if is_dense(p) else contiguous_stride(p.shape) for p in params]  # gaps dropped
    starts, end = [], 0
    for p, stride in zip(params, strides, strict=True):
        starts.append(end)
        end = align_up(end + span_elements(p.shape, stride) * p.element_size())
    flat = torch.zeros(end, dtype=torch.uint8)
    for p, start, stride in zip(params, starts, strides, strict=True):  # mixed dtypes, one byte buffer
        view = typed_view(flat, start, p.dtype, p.shape, stride)
        view.copy_(p.detach())
        p.data = view
    assert len({p.untyped_storage().data_ptr() for p in params}) == 1
    rows = [b.row for b in model.all_blocks()]  # buffers still view the old weight storages
    expected = sum(t.numel() * t.element_size() for t in [*params, *rows])
    streamer = LayerwiseStreamer(model.block_lists(), "cpu")
    streamer.attach()
    assert streamer.host_bytes <= 1.02 * expected
    with torch.no_grad():
        assert torch.equal(model(_input()), reference(_input()))
        assert torch.equal(model(_input()), reference(_input()))
    streamer.detach()


def test_meta_weights_are_rejected():
    with torch.device("meta"):
        model = ToyModel(2, DIM)
    streamer = LayerwiseStreamer(model.block_lists(), "cpu")
    with pytest.raises(ValueError, match="meta"):
        streamer.attach()


@pytest.mark.parametrize("resident", [(False, True, False, False, True), (True, False, False, False, False)])
def test_streamer_carries_out_a_given_residency_with_one_slot(resident):
    """The plan may keep any blocks and give fewer slots; the streamer does exactly that, bit-exact."""
    reference = ToyModel(5, DIM)
    model = ToyModel(5, DIM)
    residency = BlockResidency(resident, 1)
    streamer = LayerwiseStreamer(model.block_lists(), "cpu", residency=residency)
    streamer.attach()
    assert streamer.num_slots == 1 and streamer.slot_bytes == streamer.largest_block_bytes
    assert [state == "resident" for _, state, _ in streamer.block_states()] == list(resident)
    x = _input()
    with torch.no_grad():
        expected = reference(x)
        for _ in range(3):
            assert torch.equal(model(x), expected)
    streamer.detach()


@pytest.mark.parametrize(("resident_layers", "slots"), [(0, 2), (2, 1), (3, 0)])
def test_resident_layers_shorthand_is_the_leading_residency(resident_layers, slots):
    model, streamer = _streamed(3, resident_layers)
    assert streamer.residency == BlockResidency.leading(3, resident_layers)
    assert streamer.num_slots == slots
    streamer.detach()
    assert streamer.num_slots == 0


def test_residency_must_cover_every_block_and_not_come_twice():
    model = ToyModel(3, DIM)
    with pytest.raises(ValueError, match="residency covers 2 blocks, the block lists hold 3"):
        LayerwiseStreamer(model.block_lists(), "cpu", residency=BlockResidency.leading(2, 0))
    with pytest.raises(ValueError, match="not both"):
        LayerwiseStreamer(model.block_lists(), "cpu", residency=BlockResidency.leading(3, 0), resident_layers=0)
