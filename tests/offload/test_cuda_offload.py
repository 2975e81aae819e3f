"""The offload runtime on a real GPU: pinned arenas, exact streaming, memory bounds, overlap, teardown.

Copies are byte-exact, so a streamed model must be bit-identical (tolerance 0, bf16 included) to the
same model resident on the same device. Skipped without CUDA.
"""

from __future__ import annotations

import gc

import pytest
import torch
from offload_toy_models import ToyModel, block_tensor_bytes

from omni_console.offload.cache import AllocatorCache
from omni_console.offload.events import CacheDecision, EventBus, OomRetry, StagingEvent
from omni_console.offload.pinned import HostArena, pinned_bytes_held
from omni_console.offload.staged_calls import stage_around
from omni_console.offload.stager import ModuleStager, default_allocate
from omni_console.offload.streamer import LayerwiseStreamer

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

DIM = 512
DEV = torch.device("cuda", 0)


def _x() -> torch.Tensor:
    return torch.randn(8, DIM, generator=torch.Generator().manual_seed(3)).to(DEV)


def _non_blocks_to(model: ToyModel, device: torch.device) -> None:
    model.embed.to(device)
    model.out.to(device)


def _resident_reference(n: int) -> ToyModel:
    return ToyModel(n, DIM).to(DEV)


def _clean() -> None:
    gc.collect()
    torch.cuda.synchronize()


def test_arena_is_page_locked_at_exact_size_and_copies_asynchronously():
    before = pinned_bytes_held()
    n = 3 * 1024 * 1024 + 4096 + 7  # not a power of two: the arena must not round it
    arena = HostArena(n, pin=True)
    assert arena.pinned, arena.pin_failure_reason
    assert arena.tensor.is_pinned()
    assert pinned_bytes_held() == before + n
    arena.tensor.copy_(torch.arange(n, dtype=torch.int64).remainder(251).to(torch.uint8))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dev = arena.tensor.to(DEV, non_blocking=True)
    stream.synchronize()
    assert torch.equal(dev.cpu(), arena.tensor)
    arena.close()
    assert pinned_bytes_held() == before


@pytest.mark.parametrize(("n", "resident"), [(1, 0), (2, 0), (3, 1), (5, 0), (5, 2), (5, 5)])
def test_streamed_model_is_bit_identical_to_resident(n, resident):
    reference = _resident_reference(n)
    model = ToyModel(n, DIM)
    _non_blocks_to(model, DEV)
    streamer = LayerwiseStreamer(model.block_lists(), DEV, resident_layers=resident)
    streamer.attach()
    x = _x()
    with torch.no_grad():
        expected = reference(x)
        for _ in range(3):
            assert torch.equal(model(x), expected)  # tolerance 0: copies are byte-exact
            streamer.take_step_stats()
    assert all(all(b.aliased) for b in model.all_blocks())
    streamer.detach()


def test_pinned_host_bytes_are_tight():
    model = ToyModel(6, DIM)
    expected = sum(block_tensor_bytes(b) for b in model.all_blocks())
    before = pinned_bytes_held()
    streamer = LayerwiseStreamer(model.block_lists(), DEV)
    streamer.attach()
    assert streamer.pinned_bytes == streamer.host_bytes > 0, streamer.pin_failure_reason
    assert streamer.pinned_bytes <= 1.02 * expected
    assert pinned_bytes_held() - before == streamer.pinned_bytes
    streamer.detach()


def test_peak_memory_is_non_blocks_plus_two_slots_plus_activations():
    x = _x()
    reference = _resident_reference(6)
    _clean()
    with torch.no_grad():
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        reference(x)
        activations = torch.cuda.max_memory_allocated() - base
    del reference
    _clean()

    model = ToyModel(6, DIM)
    _non_blocks_to(model, DEV)
    before = torch.cuda.memory_allocated()
    streamer = LayerwiseStreamer(model.block_lists(), DEV)
    streamer.attach()
    slots = torch.cuda.memory_allocated() - before
    assert slots <= streamer.slot_bytes + 4096  # allocator rounding only
    assert streamer.slot_bytes == 2 * streamer.largest_block_bytes
    with torch.no_grad():
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        model(x)
        model(x)
        peak = torch.cuda.max_memory_allocated() - start
    assert peak <= activations + 1024 * 1024, (peak, activations)
    largest = streamer.largest_block_bytes
    assert torch.cuda.max_memory_allocated() <= before + 2 * largest + activations + 1024 * 1024
    streamer.detach()


def test_copies_overlap_and_are_measured():
    bus = EventBus()
    sub = bus.subscribe()
    model = ToyModel(6, DIM)
    _non_blocks_to(model, DEV)
    streamer = LayerwiseStreamer(model.block_lists(), DEV, bus=bus)
    streamer.attach()
    streamer.take_step_stats(wait=True)  # the warm-up: block 0, and block 1 ahead of it
    with torch.no_grad():
        model(_x())  # first forward: blocks 2..5, then the refill of blocks 0 and 1 for the next forward
    assert streamer.take_step_stats(wait=True).transfers == 6
    sub.drain()
    with torch.no_grad():
        model(_x())
    stats = streamer.take_step_stats(wait=True)
    assert stats.transfers == 6 and stats.h2d_bytes > 0
    events = [e for e in sub.drain() if isinstance(e, StagingEvent)]
    assert len(events) == 6 and not any(e.sync for e in events)
    # overlapped: compute waits on a copy at most as long as the copy itself runs (1 ms for event timing)
    assert stats.stall_s <= sum(e.seconds for e in events) + 1e-3
    assert all(e.gbps > 0 for e in events)
    states = {s for _, s, _ in streamer.block_states()}
    assert states <= {"device", "in_flight", "host"}
    streamer.detach()


def test_detach_returns_device_and_pinned_memory_to_baseline():
    model = ToyModel(5, DIM)
    _non_blocks_to(model, DEV)
    _clean()
    allocated = torch.cuda.memory_allocated()
    pinned = pinned_bytes_held()
    streamer = LayerwiseStreamer(model.block_lists(), DEV, resident_layers=1)
    streamer.attach()
    with torch.no_grad():
        out = model(_x())
    del out
    assert torch.cuda.memory_allocated() > allocated and pinned_bytes_held() > pinned
    streamer.detach()
    _clean()
    assert torch.cuda.memory_allocated() == allocated
    assert pinned_bytes_held() == pinned


class _Aux(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.enc = torch.nn.Linear(DIM, DIM, dtype=torch.bfloat16)
        self.dec = torch.nn.Linear(DIM, DIM, dtype=torch.bfloat16)
        self.dec.weight = self.enc.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dec(torch.relu(self.enc(x.to(torch.bfloat16))))


def test_stager_loads_pinned_masters_exactly_and_frees_device_memory():
    bus = EventBus()
    sub = bus.subscribe()
    reference = _Aux().to(DEV)
    with torch.no_grad():
        expected = reference(_x())
    del reference
    _clean()
    module = _Aux()
    allocated = torch.cuda.memory_allocated()
    stager = ModuleStager("text_encoder", module, DEV, bus=bus, cache=AllocatorCache(DEV, bus=bus))
    assert 0 < stager.staged_bytes <= stager.pinned_bytes < stager.staged_bytes + 256 * len(list(module.parameters()))
    undo = stage_around(stager, module)
    with torch.no_grad():
        out = module(_x())
    assert torch.equal(out, expected)
    del out
    _clean()
    assert not stager.loaded and torch.cuda.memory_allocated() == allocated
    events = sub.drain()
    h2d = [e for e in events if isinstance(e, StagingEvent) and e.direction == "h2d"]
    assert len(h2d) == 1 and h2d[0].nbytes == stager.staged_bytes and h2d[0].gbps > 0
    assert [e for e in events if isinstance(e, CacheDecision)]
    undo()
    stager.close()


def test_stager_out_of_memory_retry_on_cuda():
    bus = EventBus()
    sub = bus.subscribe()
    module = _Aux()
    stager = ModuleStager("vae", module, DEV, bus=bus)
    attempts: list[int] = []

    def flaky(nbytes: int, device: torch.device) -> torch.Tensor:
        attempts.append(nbytes)
        if len(attempts) == 1:
            raise torch.OutOfMemoryError("injected")
        return default_allocate(nbytes, device)

    stager.allocate = flaky
    stager.load()
    assert stager.loaded and module.enc.weight.device == DEV
    assert len([e for e in sub.drain() if isinstance(e, OomRetry)]) == 1
    stager.offload()
    assert module.enc.weight.device.type == "cpu" and module.enc.weight.is_pinned()
    stager.close()


@pytest.mark.parametrize("placement", ["leading", "spread"])
@pytest.mark.parametrize(("resident", "slots"), [(0, 3), (2, 2), (3, 4)])
def test_every_placement_and_ring_depth_is_bit_identical_on_the_device(placement, resident, slots):
    from omni_console.offload.residency import BlockResidency

    reference = _resident_reference(7)
    model = ToyModel(7, DIM)
    _non_blocks_to(model, DEV)
    streamer = LayerwiseStreamer(model.block_lists(), DEV,
                                 residency=BlockResidency.placed(placement, 7, resident, slots))
    streamer.attach()
    x = _x()
    with torch.no_grad():
        expected = reference(x)
        for depth in (slots, slots + 2):
            streamer.set_slots(depth)
            for _ in range(3):
                assert torch.equal(model(x), expected)
                streamer.take_step_stats()  # never waits: copies for the next forward keep running
    streamer.detach()


def test_live_replan_on_the_device_stays_bit_identical_and_frees_what_it_drops():
    from omni_console.offload.residency import BlockResidency

    reference = _resident_reference(7)
    model = ToyModel(7, DIM)
    _non_blocks_to(model, DEV)
    streamer = LayerwiseStreamer(model.block_lists(), DEV, residency=BlockResidency.leading(7, 0), keep_masters=True)
    streamer.attach()
    x = _x()
    with torch.no_grad():
        expected = reference(x)
        assert torch.equal(model(x), expected)
        base = torch.cuda.memory_allocated(DEV)
        for residency in (BlockResidency.spread(7, 4, 3), BlockResidency.leading(7, 7), BlockResidency.leading(7, 0)):
            stats = streamer.replan(residency)
            for _ in range(2):
                assert torch.equal(model(x), expected)
            assert stats.seconds > 0
        assert torch.cuda.memory_allocated(DEV) <= base + 1024 * 1024  # back to all streamed: nothing kept
    streamer.detach()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_arena_pinned_range_by_range_copies_asynchronously_and_unpins() -> None:
    from omni_console.offload.pinned import PAGE, HostArena, pinned_bytes_held

    before = pinned_bytes_held()
    arena = HostArena(3 * PAGE * 256, pin=False)
    arena.tensor.copy_(torch.arange(arena.nbytes, dtype=torch.int64).to(torch.uint8))
    ranges = [(i * PAGE * 256, (i + 1) * PAGE * 256) for i in range(3)]
    assert arena.pin_ranges(ranges[:2]) and arena.pin_ranges(ranges[2:])
    assert arena.pinned and pinned_bytes_held() - before == arena.nbytes
    assert arena.tensor[ranges[1][0]:ranges[1][1]].is_pinned()
    device = torch.empty(arena.nbytes, dtype=torch.uint8, device="cuda")
    for lo, hi in ranges:
        device[lo:hi].copy_(arena.tensor[lo:hi], non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(device.cpu(), arena.tensor)
    arena.close()
    assert pinned_bytes_held() == before
