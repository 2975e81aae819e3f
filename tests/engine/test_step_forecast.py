"""The copy-schedule replay against cases whose answer is known by hand, and its invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_console.engine.planning.step_forecast import replay_forward
from omni_console.offload.residency import BlockResidency

GB = 1e9


def test_transfer_bound_stream_runs_at_the_link():
    # 10 blocks of 1 GB at 10 GB/s (0.1 s each) computing 0.01 s: the link is the floor, 1 s
    t = replay_forward([0.01] * 10, [int(GB)] * 10, BlockResidency.leading(10, 0, 2), 10 * GB)
    assert t.transfer_s == pytest.approx(1.0)
    assert t.seconds == pytest.approx(1.0, rel=0.02)


def test_compute_bound_stream_hides_every_copy():
    t = replay_forward([0.2] * 10, [int(GB)] * 10, BlockResidency.leading(10, 0, 2), 10 * GB)
    assert t.seconds == pytest.approx(2.0) and t.stall_s == pytest.approx(0.0)


def test_deeper_ring_hides_copies_behind_a_resident_prefix():
    """Half resident up front (compute 0.1 s each), half streamed (copy 0.1 s, compute 0.02 s):
    two slots let only one copy run during the prefix; a deep ring fetches them all there."""
    compute = [0.1] * 5 + [0.02] * 5
    sizes = [int(GB)] * 10
    two = replay_forward(compute, sizes, BlockResidency.leading(10, 5, 2), 10 * GB)
    deep = replay_forward(compute, sizes, BlockResidency.leading(10, 5, 5), 10 * GB)
    assert deep.seconds == pytest.approx(deep.floor_s) == pytest.approx(0.6)
    assert two.seconds > 1.3 * deep.seconds


def test_spread_placement_hides_copies_with_two_slots():
    compute = [0.1] * 10
    sizes = [int(GB)] * 10
    leading = replay_forward(compute, sizes, BlockResidency.leading(10, 5, 2), 5 * GB)  # copy 0.2 s
    spread = replay_forward(compute, sizes, BlockResidency.spread(10, 5, 2), 5 * GB)
    assert spread.seconds == pytest.approx(1.0)  # each copy hides behind a resident block
    assert leading.seconds > spread.seconds


def test_everything_resident_or_held_in_the_ring_is_pure_compute():
    assert replay_forward([0.1] * 4, [1] * 4, BlockResidency.all_resident(4), GB, other_s=0.05).seconds \
        == pytest.approx(0.45)
    assert replay_forward([0.1] * 4, [int(GB)] * 4, BlockResidency.leading(4, 1, 3), GB).stall_s == 0.0


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 20).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0.001, 0.1), min_size=n, max_size=n),
    st.lists(st.integers(1, 10**9), min_size=n, max_size=n),
    st.integers(0, n - 1), st.integers(2, 6), st.sampled_from(["leading", "spread"]))))
def test_replay_never_beats_the_floor_and_depth_never_hurts(case):
    compute, sizes, resident, slots, placement = case
    n = len(compute)
    bw = 5 * GB
    r = BlockResidency.placed(placement, n, resident, slots)
    t = replay_forward(compute, sizes, r, bw)
    assert t.seconds >= t.floor_s * (1 - 1e-9)
    assert t.seconds <= t.compute_s + t.transfer_s + 1e-9  # never worse than fully serial
    deeper = replay_forward(compute, sizes, BlockResidency.placed(placement, n, resident, slots + 1), bw)
    assert deeper.seconds <= t.seconds + 1e-9
