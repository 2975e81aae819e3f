"""The tier planner's two newer kinds of item against an exhaustive search on small cases (issue 35 items 5, 6):

- two experts: each expert's streamed blocks are read by its own forwards only, its resident blocks once at each
  switch to it, whole through one bounce slot (`HostItem.whole`), so the ring is sized by them too;
- fp8 storage of a 16-bit checkpoint: pinned, a block holds its fp8 bytes; from the page cache or disk, a read
  brings the file's 16-bit bytes (`HostItem.read_nbytes`), which the page cache holds and the ring's slots fit.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_console.engine.planning.tier_cost import HostItem, tier_cost
from omni_console.engine.planning.tier_plan import NothingFitsHost, choose_tiers, smallest_peak, step_seconds
from omni_console.offload.tiers import TIERS, TierRates, bounce_ring_bytes, stage_chunk_bytes

MB = 10**6


def _exhaustive(items, budget, fixed, rates, compute, cap):
    best = None
    for tiers in itertools.product(TIERS, repeat=len(items)):
        cost = tier_cost(items, tiers, rates, fixed)
        if cost.fits(budget, cap, fixed) and (best is None or step_seconds(cost, compute) < best):
            best = step_seconds(cost, compute)
    return best


block = st.integers(3, 5).map(lambda n: n * MB)
expert_blocks = st.tuples(st.lists(block, min_size=2, max_size=3), st.lists(block, max_size=1))  # streamed, resident
cases = st.fixed_dictionaries({
    "experts": st.tuples(expert_blocks, expert_blocks),
    "fp8": st.booleans(),  # a 16-bit checkpoint stored in fp8: a file read brings twice the bytes
    "extra": st.floats(-0.05, 0.5),
    "fixed": st.integers(0, 20).map(lambda n: n * MB),
    "page_cache": st.floats(0.5e9, 20e9),
    "disk": st.floats(0.5e9, 20e9),
    "compute": st.one_of(st.none(), st.floats(0.0, 0.002)),
})


def _items(case) -> list[HostItem]:
    read = 2 if case["fp8"] else 0
    return [HostItem(n, hot=hot, forward=f, read_nbytes=read * n, whole=True)
            for f, (streamed, resident) in enumerate(case["experts"])
            for hot, sizes in ((True, streamed), (False, resident)) for n in sizes]


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(cases)
def test_the_planner_finds_a_plan_for_two_experts_and_fp8_reads_exactly_when_one_exists(case):
    items = _items(case)
    rates = TierRates(link=25e9, page_cache=case["page_cache"], disk=case["disk"])
    least = smallest_peak(items, case["fixed"])
    budget = max(1, least + int(case["extra"] * sum(i.nbytes for i in items)))
    cap = budget
    oracle = _exhaustive(items, budget, case["fixed"], rates, case["compute"], cap)
    if oracle is None:
        with pytest.raises(NothingFitsHost):
            choose_tiers(items, budget, case["fixed"], rates, case["compute"], cap)
        return
    choice = choose_tiers(items, budget, case["fixed"], rates, case["compute"], cap)
    assert tier_cost(items, choice.tiers, rates, case["fixed"]).fits(budget, cap, case["fixed"])
    # first-fit by size leaves less than one block per tier unused: at most two blocks' reads from disk
    slack = 2 * max(i.file_bytes for i in items) / case["disk"]
    assert choice.step_seconds <= oracle + slack + 1e-12


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(cases)
def test_the_smallest_possible_peak_is_the_exhaustive_one_with_experts_and_fp8_reads(case):
    items = _items(case)
    least = min(tier_cost(items, t, TierRates(), case["fixed"]).host_peak_bytes
                for t in itertools.product(TIERS, repeat=len(items)))
    assert smallest_peak(items, case["fixed"]) == least


def test_fp8_blocks_pinned_hold_half_a_file_read_and_the_ring_fits_the_read():
    items = [HostItem(10 * MB, read_nbytes=20 * MB)] * 6
    rates = TierRates(link=25e9, page_cache=4e9, disk=2e9)
    pinned = tier_cost(items, ["pinned"] * 6, rates, 0)
    on_disk = tier_cost(items, ["disk"] * 6, rates, 0)
    assert pinned.pinned_bytes == 60 * MB and pinned.ring_bytes == 0  # fp8 bytes: half the 16-bit file's
    assert on_disk.disk_bytes == 120 * MB and on_disk.ring_bytes == bounce_ring_bytes(20 * MB)  # the file's
    assert on_disk.file_seconds == pytest.approx(120 * MB / 2e9)  # the 16-bit bytes read, not the fp8 ones
    assert on_disk.link_seconds == pytest.approx(60 * MB / 25e9)  # the fp8 bytes copied


def test_an_experts_resident_block_sizes_the_ring_whole():
    resident = HostItem(200 * MB, hot=False, forward=1, whole=True)
    master = HostItem(200 * MB, hot=False)
    streamed = [HostItem(10 * MB, forward=1)] * 5
    assert tier_cost([*streamed, resident], ["pinned"] * 5 + ["disk"], TierRates(), 0).ring_bytes \
        == bounce_ring_bytes(200 * MB)  # offload/streamer.py reads it through one bounce slot
    assert tier_cost([*streamed, master], ["pinned"] * 5 + ["disk"], TierRates(), 0).ring_bytes \
        == bounce_ring_bytes(stage_chunk_bytes(200 * MB))  # a staged component: its own ring, in chunks
