"""The plan's cached step range: from the uncached step down to the kind's best case, which only block-skipping
kinds lower (the others still copy every block)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from omni_console.engine.running.cache_range import cache_step_range
from omni_console.engine.running.cache_spec import CACHE_KINDS, CacheSpec


@given(kind=st.sampled_from(list(CACHE_KINDS)), blocks=st.integers(1, 200), step=st.floats(1e-4, 1e3))
def test_the_range_runs_from_no_hits_down_to_the_best_case(kind, blocks, step):
    r = cache_step_range(CacheSpec(kind), blocks, step)
    assert r.no_hits_s == step and "is a range, not a forecast" in r.line
    assert r.best_s is not None and 0 < r.best_s <= step
    assert (r.best_s < step) == (kind in ("first-block", "mag", "sea") and blocks > 1)
    if kind in ("first-block", "mag", "sea"):
        assert abs(r.best_s - step / blocks) <= 1e-12 * step


def test_lite_taylorseer_says_a_predicted_step_copies_no_block():
    from omni_console.engine.running.cache_spec import parse_cache

    r = cache_step_range(parse_cache("taylorseer:use_lite_mode=true"), 6, 0.5)
    assert r.no_hits_s == 0.5 and r.best_s is None and "a predicted step" in r.line and "no block" in r.line
