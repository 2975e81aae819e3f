"""The k-slot ring: every placement and ring depth stays bit-exact, copies run up to k-1 blocks ahead,
and each streamed block crosses the link once per forward in steady state."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from offload_toy_models import ToyModel

from omni_console.offload.events import EventBus, StagingEvent
from omni_console.offload.residency import BlockResidency, spread_streamed
from omni_console.offload.streamer import LayerwiseStreamer

DIM = 32


def _input() -> torch.Tensor:
    return torch.randn(3, DIM, generator=torch.Generator().manual_seed(5))


def _copies(sub) -> list[str]:
    return [e.target for e in sub.drain() if isinstance(e, StagingEvent)]


@pytest.mark.parametrize("placement", ["leading", "spread"])
@pytest.mark.parametrize(("n", "resident", "slots"), [(7, 0, 3), (7, 2, 4), (7, 3, 2), (8, 0, 8), (8, 4, 3),
                                                      (5, 0, 5), (6, 5, 1)])
def test_every_placement_and_depth_is_bit_identical(placement, n, resident, slots):
    reference = ToyModel(n, DIM)
    model = ToyModel(n, DIM)
    residency = BlockResidency.placed(placement, n, resident, slots)
    streamer = LayerwiseStreamer(model.block_lists(), "cpu", residency=residency)
    streamer.attach()
    assert streamer.num_slots == min(slots, n - resident)
    x = _input()
    with torch.no_grad():
        expected = reference(x)
        for _ in range(3):
            assert torch.equal(model(x), expected)
    streamer.detach()


@pytest.mark.parametrize("slots", [2, 3, 4])
def test_ring_runs_k_minus_one_blocks_ahead_and_copies_each_block_once_per_forward(slots):
    bus = EventBus()
    sub = bus.subscribe()
    n = 7
    model = ToyModel(n, DIM)
    streamer = LayerwiseStreamer(model.block_lists(), "cpu", residency=BlockResidency.leading(n, 0, slots), bus=bus)
    streamer.attach()
    names = [name for name, _, _ in streamer.block_states()]
    assert _copies(sub) == names[:slots]  # attach fills the ring: block 0 and the k-1 after it
    states = []
    hook = model.all_blocks()[0].register_forward_pre_hook(lambda *_: states.append(streamer.block_states()))
    with torch.no_grad():
        model(_input())
        _copies(sub)
        model(_input())
    hook.remove()
    # while block 0 runs, exactly the next k-1 streamed blocks are on the device too
    on_device = [name for name, state, _ in states[-1] if state == "device"]
    assert on_device == names[:slots]
    assert sorted(_copies(sub)) == sorted(names)  # steady state: each block once per forward
    streamer.detach()


def test_spread_places_streamed_blocks_evenly_and_keeps_the_count():
    assert spread_streamed(6, 3) == (False, True, False, True, False, True)
    assert spread_streamed(5, 0) == (False,) * 5 and spread_streamed(5, 5) == (True,) * 5
    r = BlockResidency.spread(57, 28, 3)
    assert r.num_resident == 28 and r.slots == 3 and r.placement == "spread" and not r.is_leading
    assert BlockResidency.leading(57, 28).is_leading


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 80).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_spread_gaps_between_streamed_blocks_differ_by_at_most_one(case):
    n, streamed = case
    flags = spread_streamed(n, streamed)
    assert sum(flags) == streamed
    positions = [i for i, f in enumerate(flags) if f]
    gaps = [b - a for a, b in zip([-1, *positions], positions, strict=False)]
    if gaps:
        assert max(gaps) - min(gaps) <= 1


def test_a_ring_deeper_than_the_streamed_blocks_never_reloads():
    bus = EventBus()
    sub = bus.subscribe()
    model = ToyModel(4, DIM)
    streamer = LayerwiseStreamer(model.block_lists(), "cpu", residency=BlockResidency.leading(4, 1, 8), bus=bus)
    streamer.attach()
    assert streamer.num_slots == 3
    _copies(sub)
    with torch.no_grad():
        model(_input())
        model(_input())
    assert _copies(sub) == []
    streamer.detach()


def test_set_slots_changes_the_depth_in_place_and_stays_exact():
    reference = ToyModel(6, DIM)
    model = ToyModel(6, DIM)
    streamer = LayerwiseStreamer(model.block_lists(), "cpu", residency=BlockResidency.spread(6, 2, 2))
    streamer.attach()
    x = _input()
    with torch.no_grad():
        expected = reference(x)
        assert torch.equal(model(x), expected)
        for slots in (4, 3, 9, 2):
            streamer.set_slots(slots)
            assert streamer.num_slots == min(slots, 4) == streamer.residency.slots
            assert streamer.residency.placement == "spread"
            assert torch.equal(model(x), expected)
    streamer.detach()
