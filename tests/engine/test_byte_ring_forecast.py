"""The step forecast replays a byte ring (a UNet's) with the streamer's own bookkeeping: a case worked
by hand, the k-slot ring where units are equal, and never faster than the floor."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from omni_console.engine.planning.step_forecast import replay_forward
from omni_console.engine.planning.stream_choice import TIE, DitProfile, candidates, choose_streaming, evaluate
from omni_console.engine.planning.stream_search import StreamTable
from omni_console.offload.residency import BlockResidency

GB = 10**9


def _ring(n: int, k: int, byte_ring: bool, resident: int = 0) -> BlockResidency:
    r = BlockResidency.leading(n, resident, k)
    return BlockResidency(r.resident, r.slots, r.placement, byte_ring=byte_ring)


def test_small_compute_heavy_units_hide_the_big_copies_only_in_a_byte_ring():
    """8 small units (50 MB, 0.05 s each) then 3 big ones (1 GB, 0.01 s) at 10 GB/s: compute 0.43 s,
    copies 0.34 s. Four largest units' bytes hold the whole cycle but the big units' overlap with the next
    small ones: all three big copies run while the small units compute, so the step is its compute. Four
    slots fetch only 3 units ahead: the big copies start during the last small units and the big units
    wait 0.04 + 0.09 s. Three units' bytes: the third big unit wraps onto the first's bytes and waits for it."""
    compute, sizes = [0.05] * 8 + [0.01] * 3, [GB // 20] * 8 + [GB] * 3
    byte4 = replay_forward(compute, sizes, _ring(11, 4, True), 10 * GB)
    slots4 = replay_forward(compute, sizes, _ring(11, 4, False), 10 * GB)
    byte3 = replay_forward(compute, sizes, _ring(11, 3, True), 10 * GB)
    assert byte4.seconds == pytest.approx(byte4.floor_s) == pytest.approx(0.43)
    assert byte4.stall_s == pytest.approx(0.0, abs=1e-9)
    assert slots4.seconds == pytest.approx(0.56) and slots4.stall_s == pytest.approx(0.13)
    assert byte3.seconds == pytest.approx(0.525)  # 0.43 + the 0.095 s the third big unit waits


def test_a_ring_that_holds_every_unit_copies_nothing_per_step():
    t = replay_forward([0.1] * 4, [GB, 256, 256, GB - 512], _ring(4, 2, True), GB, other_s=0.05)  # 2 GB: all fit
    assert t.seconds == pytest.approx(0.45) and t.stall_s == 0.0


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4).flatmap(lambda k: st.tuples(
    st.just(k), st.integers(1, 5).map(lambda laps: laps * k),
    st.lists(st.floats(0.001, 0.1), min_size=20, max_size=20), st.integers(10**6, 10**9))))
def test_equal_units_filling_whole_laps_replay_as_the_k_slot_ring(case):
    k, n, compute, size = case
    args = (compute[:n], [size] * n)
    assert replay_forward(*args, _ring(n, k, True), 10 * GB).seconds == pytest.approx(
        replay_forward(*args, _ring(n, k, False), 10 * GB).seconds)


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 20).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0.001, 0.1), min_size=n, max_size=n),
    st.lists(st.integers(1, 10**9), min_size=n, max_size=n),
    st.integers(0, n - 1), st.integers(1, 6))))
def test_a_byte_ring_never_beats_the_floor(case):
    compute, sizes, resident, slots = case
    t = replay_forward(compute, sizes, _ring(len(compute), slots, True, resident), 5 * GB)
    assert t.seconds >= t.floor_s * (1 - 1e-9)


@settings(max_examples=200, deadline=None)
@example(([0, 256, 256], [0.0, 0.0, 0.0], 1e8, None))  # a block of no bytes: two candidates equal in both
@given(st.lists(st.integers(0, 4_000_000), min_size=0, max_size=7).flatmap(lambda sizes: st.tuples(
    st.just(sizes),
    st.lists(st.floats(0, 0.05), min_size=len(sizes), max_size=len(sizes)) | st.just([0.0] * len(sizes)),
    st.sampled_from([1e8, 1e9, 5.5e10]), st.integers(0, 40_000_000) | st.none())))
def test_the_planner_search_over_byte_rings_gives_the_exhaustive_choice(case):
    """`--vram-budget` sizes a UNet's byte ring (k largest units' bytes) by the same search as a DiT's
    slots: its bounds stay true for byte rings, so it picks what replaying every candidate picks."""
    sizes, compute, bandwidth, budget = case
    profile = DitProfile(tuple(sizes), tuple(compute), 0.01 if any(compute) else 0.0, 2, 1000)
    fast, _ = choose_streaming(profile, bandwidth, 0, budget, table=StreamTable(profile, bandwidth, byte_ring=True))
    every = [evaluate(profile, BlockResidency(r.resident, r.slots, r.placement, byte_ring=bool(r.num_streamed)),
                      bandwidth, 0) for r in candidates(len(sizes))]
    fits = [c for c in every if budget is None or c.peak_bytes <= budget]
    if not fits:
        assert fast is None
        return
    fastest = min(c.step_s for c in fits)
    ties = [c for c in fits if c.step_s <= fastest * (1 + TIE)]
    # what replaying every candidate picks: within the tie of the fastest, the smallest peak (candidates
    # equal in both, e.g. a block of no bytes resident or not, are the same choice to the operator)
    assert fast.step_s <= fastest * (1 + TIE)
    assert fast.peak_bytes == min(c.peak_bytes for c in ties)
    assert fast.residency.byte_ring or not fast.residency.num_streamed
