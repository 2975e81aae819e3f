"""`--vram-budget` with fp8 storage weighs keeping resident blocks upcast (engine/planning/upcast_choice.py):
the choice always fits, keeps blocks upcast only where that lowers the predicted step, matches an
exhaustive search over (candidate, upcast count), and at an equal step streams the fewest bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.auto_plan import auto_plan
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.request_forecast import forecast_request
from omni_console.engine.planning.request_profile import RequestProfile, RequestSize
from omni_console.engine.planning.stream_choice import TIE, DitProfile, candidates, evaluate
from omni_console.engine.planning.stream_search import StreamTable
from omni_console.engine.planning.upcast_choice import Pick, UpcastChooser
from omni_console.offload.policy import build_policy

SIZE = RequestSize(height=64, width=64)
FP8 = "float8_e4m3fn"


def _exhaustive_best(profile: DitProfile, upcast: list[float], extra: list[int], bandwidth: float, room: int) -> float:
    """The fastest step of every (candidate, upcast count) whose room fits, replayed one by one."""
    best = float("inf")
    for r in candidates(len(profile.block_bytes)):
        base = evaluate(profile, r, bandwidth, 0)
        for u in range(r.num_resident + 1):
            kept = r.with_upcast(u).upcast_flags
            need = base.resident_bytes + base.slot_bytes + sum(e for e, k in zip(extra, kept, strict=True) if k)
            if need > room:
                break
            compute = tuple(c - s if k else c for c, s, k in zip(profile.compute_s, upcast, kept, strict=True))
            step = evaluate(DitProfile(profile.block_bytes, compute, profile.other_s, 1, 0), r, bandwidth, 0).step_s
            best = min(best, step)
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1_000, 400_000), st.floats(1e-4, 5e-3), st.floats(0, 2e-3)), min_size=1,
                max_size=6),
       st.sampled_from([1e8, 1e9, 5.5e10]), st.integers(0, 3_000_000), st.floats(0.2, 1.0))
def test_the_choice_fits_gains_and_matches_the_exhaustive_search(blocks, bandwidth, room, ratio):
    sizes = [b for b, _, _ in blocks]
    upcast = [u for _, _, u in blocks]
    profile = DitProfile(tuple(sizes), tuple(c + u for _, c, u in blocks), 1e-4, 1, 0)
    extra = [int(b * ratio) for b in sizes]  # the fp8 elements a block holds (each one more byte upcast)
    chooser = UpcastChooser(StreamTable(profile, bandwidth), upcast, extra)
    for prefer in ("room", "streamed"):
        pick = chooser.choose(room, TIE, prefer)  # type: ignore[arg-type]
        if pick is None:
            assert chooser.table.fastest(room) is None
            continue
        assert chooser.room_of(pick) <= room
        if pick.upcast:  # only where it lowers the step
            assert chooser.step(pick) < chooser.step(Pick(pick.index))
        assert chooser.step(pick) <= _exhaustive_best(profile, upcast, extra, bandwidth, room) * (1 + TIE) * (1 + 1e-9)


def _flux_like() -> tuple[DitProfile, UpcastChooser]:
    """Flux-size (H200 anchors): 57 blocks, 15.15 GB fp8, 8.65e9 fp8 elements, 0.171 s bf16 compute a forward,
    upcast at 2.9e11 elements/s, 55 GB/s."""
    n, fp8_bytes, elems = 57, int(15.15e9 / 57), int(8.65e9 / 57)
    up, compute = elems / 2.9e11, 0.1714 / 57
    profile = DitProfile((fp8_bytes,) * n, (compute + up,) * n, 0.0, 1, 0)
    return profile, UpcastChooser(StreamTable(profile, 55e9), (up,) * n, (elems,) * n)


def test_at_an_equal_step_the_final_choice_streams_the_fewest_bytes():
    profile, chooser = _flux_like()

    def streamed(p: Pick) -> int:
        r = chooser.residency(p)
        return sum(b for b, kept in zip(profile.block_bytes, r.resident, strict=True) if not kept)

    differed = False
    for gb in (8, 12, 16, 24):
        room = int(gb * 1e9)
        best = chooser.step(chooser.choose(room, 0.0))  # type: ignore[arg-type]
        by_room, by_link = chooser.choose(room, TIE, "room"), chooser.choose(room, TIE, "streamed")
        assert by_room is not None and by_link is not None
        assert chooser.step(by_link) <= best * (1 + TIE) and chooser.room_of(by_link) <= room
        assert streamed(by_link) <= streamed(by_room)
        differed |= streamed(by_link) < streamed(by_room)
    assert differed  # the tie-break decides somewhere in the sweep's budgets


def test_upcast_wins_where_compute_bounds_the_step_and_not_where_the_link_does():
    profile, chooser = _flux_like()
    pick = chooser.choose(int(24e9), TIE, "streamed")
    assert pick is not None and pick.upcast > 0 and chooser.step(pick) < chooser.step(Pick(pick.index))
    link_bound = StreamTable(profile, 1e9)  # a slow link: the step is the copies, upcast saves nothing
    slow = UpcastChooser(link_bound, chooser.upcast_s, chooser.extra)
    chosen = slow.choose(int(6e9), TIE, "streamed")
    assert chosen is not None and chosen.upcast == 0


def _profile(blocks: int, compute: float = 1e-3) -> RequestProfile:
    return RequestProfile(model="/m", model_bytes=1, device="NVIDIA H200", size=SIZE,
                          block_compute_s=[compute] * blocks, other_s=compute, forwards_per_step=1,
                          text_extra_bytes=0, denoise_extra_bytes=1000,
                          decode_extra_bytes=0, bandwidth_bytes_per_s=1e8, measured_at="2026-12-01T00:00:00")


def test_the_budget_planner_keeps_blocks_upcast_and_the_forecast_agrees(demo_model_dir: Path):
    model = discover_model(demo_model_dir)
    fp8 = make_plan(model, build_policy({}, 0, stream_dtype=FP8))
    profile = _profile(len(fp8.blocks))
    roomy = int(1e9)  # everything fits: every block resident, and upcast (compute-bound: it saves time)
    chosen = auto_plan(fp8, roomy, SIZE, profile, "cached", 1e8, "measured")
    r = chosen.plan.residency
    assert r.num_resident == len(fp8.blocks) and r.num_upcast == r.num_resident
    assert chosen.plan.policy.upcast_resident == r.num_upcast
    assert any("kept upcast" in line for line in chosen.reasons)
    off = auto_plan(make_plan(model, build_policy({}, 0, stream_dtype=FP8, upcast_resident="off")), roomy, SIZE,
                    profile, "cached", 1e8, "measured")
    assert off.plan.residency.num_upcast == 0 and off.plan.policy.upcast_resident == "off"
    assert chosen.forecast.step_s is not None and off.forecast.step_s is not None
    assert chosen.forecast.step_s < off.forecast.step_s  # no upcast per forward left
    assert chosen.forecast.peak_bytes > off.forecast.peak_bytes  # at the compute dtype's bytes
    # every budget between the fp8 choice's peak and the all-upcast one: the forecast peak fits
    for budget in range(off.forecast.peak_bytes + 510, chosen.forecast.peak_bytes + 510, 97_003):
        fitted = auto_plan(fp8, budget, SIZE, profile, "cached", 1e8, "measured")
        assert fitted.forecast.peak_bytes <= budget, budget


def test_full_precision_plans_are_untouched(demo_model_dir: Path):
    model = discover_model(demo_model_dir)
    plain = make_plan(model, build_policy({}, 0))
    profile = _profile(len(plain.blocks))
    chosen = auto_plan(plain, int(1e9), SIZE, profile, "cached", 1e8, "measured")
    assert chosen.plan.residency.upcast == () and chosen.plan.policy.upcast_resident == "auto"
    assert not any("upcast" in line for line in chosen.reasons)


def test_the_step_forecast_drops_the_upcast_of_kept_blocks(demo_model_dir: Path):
    model = discover_model(demo_model_dir)
    n = model.num_dit_blocks
    profile = _profile(n)
    steps = []
    for upcast in (0, 1, n):
        plan = make_plan(model, build_policy({}, n, stream_dtype=FP8, upcast_resident=upcast))
        f = forecast_request(plan, SIZE, profile, "cached", 1e8, "measured")
        assert f.step_s is not None
        steps.append(f.step_s)
    assert steps[0] > steps[1] > steps[2]
    assert steps[2] == pytest.approx((n + 1) * 1e-3, rel=1e-9)  # compute alone: no upcast left
