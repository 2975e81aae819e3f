"""The tier planner (`--ram-budget`) against an exhaustive search over every assignment of small cases: it
finds a plan exactly when one exists, the plan fits, its step is the optimum's where blocks are one size
and within one block's reads of it otherwise; slow blocks are spread evenly; a case worked by hand."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_console.engine.planning.tier_cost import HostItem, pin_cap, tier_cost
from omni_console.engine.planning.tier_plan import NothingFitsHost, choose_tiers, smallest_peak, step_seconds
from omni_console.offload.tiers import TIERS, TierRates, bounce_ring_bytes

MB = 10**6


def _exhaustive(items, budget, fixed, rates, compute, cap):
    """(best step, its assignment) over every assignment that fits, None when none does."""
    best = None
    for tiers in itertools.product(TIERS, repeat=len(items)):
        cost = tier_cost(items, tiers, rates, fixed)
        if cost.fits(budget, cap, fixed):
            step = step_seconds(cost, compute)
            if best is None or step < best[0]:
                best = (step, tiers)
    return best


# the ring's 4 slots hold the largest file-tier block: file tiers pay only for more than 4 blocks of a size
small = st.integers(3, 4).map(lambda n: n * MB)
sizes = st.one_of(small, st.integers(20, 40).map(lambda n: n * MB))
cases = st.fixed_dictionaries({
    "hot": st.tuples(st.lists(small, min_size=5, max_size=6), st.lists(sizes, max_size=1)).map(lambda t: t[0] + t[1]),
    "cold": st.lists(st.integers(1, 120).map(lambda n: n * MB), min_size=0, max_size=1),
    "extra": st.floats(-0.05, 0.4),  # the budget above the smallest possible peak, as a share of the items' bytes
    "fixed": st.integers(0, 20).map(lambda n: n * MB),
    "page_cache": st.floats(0.5e9, 20e9),
    "disk": st.floats(0.5e9, 20e9),
    "compute": st.one_of(st.none(), st.floats(0.0, 0.02)),
    "cap_share": st.floats(-0.05, 0.8),  # the pin cap above the smallest peak's pinned bytes, likewise
})


def _setup(case):
    items = [HostItem(n) for n in case["hot"]] + [HostItem(n, hot=False) for n in case["cold"]]
    rates = TierRates(link=25e9, page_cache=case["page_cache"], disk=case["disk"])
    least = smallest_peak(items, case["fixed"])  # tested against the exhaustive one below
    case["budget"] = max(1, least + int(case["extra"] * sum(i.nbytes for i in items)))
    cap = max(0, least - case["fixed"] + int((case["budget"] - least) * case["cap_share"]))
    return items, rates, cap


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(cases)
def test_the_planner_finds_a_plan_exactly_when_one_exists_and_it_fits(case):
    items, rates, cap = _setup(case)
    oracle = _exhaustive(items, case["budget"], case["fixed"], rates, case["compute"], cap)
    if oracle is None:
        with pytest.raises(NothingFitsHost):
            choose_tiers(items, case["budget"], case["fixed"], rates, case["compute"], cap)
        return
    choice = choose_tiers(items, case["budget"], case["fixed"], rates, case["compute"], cap)
    cost = tier_cost(items, choice.tiers, rates, case["fixed"])
    assert cost.fits(case["budget"], cap, case["fixed"])
    assert choice.cost.host_peak_bytes <= case["budget"]
    # first-fit by size leaves less than one block per tier unused: at most two blocks' bytes read from disk
    slack = 2 * max(case["hot"], default=0) / case["disk"]
    assert choice.step_seconds <= oracle[0] + slack + 1e-12


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(cases, st.integers(1, 8))
def test_blocks_of_one_size_get_the_optimal_step(case, n):
    case = {**case, "hot": [case["hot"][0] if case["hot"] else 7 * MB] * n, "cold": []}
    items, rates, cap = _setup(case)
    oracle = _exhaustive(items, case["budget"], case["fixed"], rates, case["compute"], cap)
    if oracle is None:
        return
    choice = choose_tiers(items, case["budget"], case["fixed"], rates, case["compute"], cap)
    assert choice.step_seconds == pytest.approx(oracle[0], rel=1e-9, abs=1e-15)


@settings(max_examples=100, deadline=None)
@given(st.lists(sizes, min_size=1, max_size=5), st.lists(st.integers(1, 120).map(lambda n: n * MB), max_size=2),
       st.integers(0, 50).map(lambda n: n * MB))
def test_the_smallest_possible_peak_is_the_exhaustive_one(hot, cold, fixed):
    items = [HostItem(n) for n in hot] + [HostItem(n, hot=False) for n in cold]
    least = min(tier_cost(items, t, TierRates(), fixed).host_peak_bytes
                for t in itertools.product(TIERS, repeat=len(items)))
    assert smallest_peak(items, fixed) == least


def test_a_budget_nothing_fits_names_the_smallest_peak():
    items = [HostItem(100 * MB)] * 10
    least = 10 * MB + bounce_ring_bytes(100 * MB)  # every block read through the ring (all pinned: 1,010 MB)
    assert smallest_peak(items, 10 * MB) == least
    with pytest.raises(NothingFitsHost, match=r"smallest possible host peak is 410,048,128 bytes"):
        choose_tiers(items, least - 1, 10 * MB, TierRates())  # sizes that read the same: in bytes
    with pytest.raises(NothingFitsHost, match=r"in 300\.0 MB .* smallest possible host peak is 410\.0 MB"):
        choose_tiers(items, 300 * MB, 10 * MB, TierRates())
    assert choose_tiers(items, least, 10 * MB, TierRates(), cap=least).cost.host_peak_bytes == least


def test_worked_case_pins_what_the_cap_allows_caches_what_ram_holds_and_reads_the_rest_from_disk():
    # 10 blocks of 100 MB; 1.2 GB budget, 100 MB fixed, pin cap 700 MB; the ring holds 4 slots of ~100 MB
    items = [HostItem(100 * MB)] * 10
    rates = TierRates(link=20e9, page_cache=4e9, disk=2e9)
    ring = bounce_ring_bytes(100 * MB)
    choice = choose_tiers(items, 1_200 * MB, 100 * MB, rates, compute_s=None, cap=700 * MB)
    assert choice.tiers.count("pinned") == 2  # 2 x 100 MB + the ring's 4 x ~100 MB under 700 MB
    assert choice.tiers.count("page_cache") == 4  # 1200 - 100 fixed - 200 pinned - ring: room for 4
    assert choice.tiers.count("disk") == 4
    assert choice.cost.ring_bytes == ring
    assert choice.cost.host_peak_bytes == 100 * MB + 200 * MB + ring
    assert choice.step_seconds == pytest.approx(4 * 100 * MB / 4e9 + 4 * 100 * MB / 2e9)
    # the page cache slower than O_DIRECT: nothing is left to it
    slow_cache = choose_tiers(items, 1_200 * MB, 100 * MB, TierRates(20e9, 1e9, 2e9), cap=700 * MB)
    assert slow_cache.tiers.count("page_cache") == 0 and slow_cache.tiers.count("disk") == 8
    # compute that hides the reads: the step is the compute
    assert choose_tiers(items, 1_200 * MB, 100 * MB, rates, compute_s=1.0, cap=700 * MB).step_seconds == 1.0


def test_everything_pinned_when_the_budget_holds_it():
    items = [HostItem(100 * MB)] * 3 + [HostItem(500 * MB, hot=False)]
    choice = choose_tiers(items, 10**10, 10**8, TierRates())
    assert set(choice.tiers) == {"pinned"} and choice.cost.ring_bytes == 0


@pytest.mark.parametrize("n, pinned", [(40, 10), (40, 30), (57, 19), (12, 5)])
def test_file_tier_blocks_are_spread_evenly_in_execution_order(n, pinned):
    items = [HostItem(10 * MB)] * n
    ring = bounce_ring_bytes(10 * MB)
    choice = choose_tiers(items, 10**12, 0, TierRates(20e9, 1e9, 2e9), cap=pinned * 10 * MB + ring)
    filed = [i for i, t in enumerate(choice.tiers) if t != "pinned"]
    assert len(filed) == n - pinned
    gaps = [b - a for a, b in itertools.pairwise(filed)]
    assert max(gaps) - min(gaps) <= 1


def test_the_pin_cap_rule():
    GIB = 2**30
    assert pin_cap(16 * GIB) == 12 * GIB  # min(90 %, 16 - 4 GiB)
    assert pin_cap(128 * GIB) == int(0.9 * 128 * GIB)
    assert pin_cap(5 * GIB) == int(0.4 * 5 * GIB)  # never below 40 %


def test_4096_blocks_of_distinct_sizes_plan_within_seconds_and_fit():
    import random
    import time

    rng = random.Random(0)
    items = [HostItem(rng.randint(2 * MB, 700 * MB)) for _ in range(4096)] + [HostItem(9_500 * MB, hot=False)]
    budget = sum(i.nbytes for i in items) // 2
    start = time.perf_counter()
    choice = choose_tiers(items, budget, 1_500 * MB, TierRates(20e9, 4e9, 3e9))
    assert time.perf_counter() - start < 5  # about 0.4 s: MAX_RING_SIZES ring sizes tried, not 4096
    assert choice.cost.fits(budget, choice.pin_cap, 1_500 * MB) and "disk" in choice.tiers


# staged encoders/VAEs: cold items read once per stage, whole (64 MiB chunks) or a layer per slot (`chunk`)
staged_items = st.lists(st.tuples(st.integers(1, 200).map(lambda n: n * MB), st.sampled_from([0, 2 * MB, 9 * MB])),
                        min_size=1, max_size=3)


@settings(max_examples=80, deadline=None)
@given(st.lists(small, min_size=0, max_size=4), staged_items, st.integers(0, 20).map(lambda n: n * MB),
       st.floats(-0.05, 0.5), st.floats(0.5e9, 20e9), st.floats(0.5e9, 20e9))
def test_staged_components_plan_exactly_when_an_assignment_fits(hot, staged, fixed, extra, page_cache, disk):
    items = [HostItem(n) for n in hot] + [HostItem(n, hot=False, chunk=c) for n, c in staged]
    rates = TierRates(link=25e9, page_cache=page_cache, disk=disk)
    least = min(tier_cost(items, t, rates, fixed).host_peak_bytes for t in itertools.product(TIERS, repeat=len(items)))
    assert smallest_peak(items, fixed) == least
    budget = max(1, least + int(extra * sum(i.nbytes for i in items)))
    cap = budget  # the pin cap is another test's: here every pinned byte may be pinned
    oracle = _exhaustive(items, budget, fixed, rates, None, cap)
    if oracle is None:
        with pytest.raises(NothingFitsHost):
            choose_tiers(items, budget, fixed, rates, None, cap)
        return
    choice = choose_tiers(items, budget, fixed, rates, None, cap)
    assert tier_cost(items, choice.tiers, rates, fixed).fits(budget, cap, fixed)


def test_an_encoder_goes_to_a_file_tier_before_the_planner_gives_up():
    blocks = [HostItem(100 * MB)] * 4
    t5 = HostItem(9_000 * MB, hot=False)
    rates = TierRates(20e9, 3e9, 2e9)
    fixed = 500 * MB
    budget = fixed + 4 * 100 * MB + bounce_ring_bytes(64 * 2**20) + 300 * MB  # the blocks pinned; not the T5
    choice = choose_tiers([*blocks, t5], budget, fixed, rates, cap=budget)
    assert choice.tiers[:4] == ("pinned",) * 4 and choice.tiers[4] != "pinned"
    assert choice.cost.ring_bytes == bounce_ring_bytes(64 * 2**20)  # the staged components' ring only
    with pytest.raises(NothingFitsHost):
        choose_tiers([*blocks, t5], fixed + 100 * MB, fixed, rates, cap=budget)
