"""After one request of a size, the process forecast counts what the caching allocator held above its
allocated peak (cache and fragmentation), as that request measured it under the same plan; under a budget
it stays inside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny_families import FAMILY_GENERATION

from omni_console.engine.engine import Engine
from omni_console.engine.events import ForecastCheck
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.plan_flow import plan_for
from omni_console.engine.planning import device_footprint as fp
from omni_console.engine.planning.device_footprint import DeviceOverhead, margin_for
from omni_console.engine.planning.model_configs import fill_size
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.profile_basis import profile_for
from omni_console.engine.planning.request_forecast import forecast_for
from omni_console.engine.planning.request_profile import RequestSize, save_profile
from omni_console.engine.planning.slack_config import plan_key
from omni_console.engine.running import runner
from omni_console.engine.running.run_memory import RunMemory
from omni_console.engine.running.runner import GenerateRequest, RunOutput
from omni_console.offload.policy import build_policy

GB = 10**9
GPU = "NVIDIA H200"
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(fp, "_versions", lambda: ("2.13.0", "999.1"))


@given(allocated=st.integers(0, 100 * GB), slack=st.none() | st.integers(0, 20 * GB),
       budget=st.none() | st.integers(1, 120 * GB))
def test_the_slack_replaces_a_smaller_margin_and_a_budget_caps_the_figure(allocated, slack, budget):
    o = DeviceOverhead(800_000_000, "measured", GPU)
    figure = o.process_bytes(allocated, slack, budget)
    plain = allocated + o.context_bytes + max(margin_for(allocated), slack or 0)
    if budget is None or plain <= budget:
        assert figure == plain
    else:  # the allocator is capped at budget - context: never above the budget (unless the weights alone are)
        assert figure == max(budget, allocated + o.context_bytes)
    assert o.process_bytes(allocated) == allocated + o.context_bytes + margin_for(allocated)  # as before
    assert DeviceOverhead(0, "none").process_bytes(allocated, slack, budget) == allocated  # a CPU


def test_a_run_reports_reserved_above_allocated_only_on_a_gpu():
    run = RunOutput(frames=[], is_video=False, steps=[], latent_shape=None, phases={}, vae_decode_peak_bytes=None,
                    peak_before_decode=None, allocated_peak=6 * GB, reserved_peak=7 * GB)
    assert run.allocator_slack == GB
    assert RunOutput(frames=[], is_video=False, steps=[], latent_shape=None, phases={}, vae_decode_peak_bytes=None,
                     peak_before_decode=None).allocator_slack is None


def _measured(model_dir: Path, size: RequestSize, slack: int, budget: int | None = None):
    """A profile of `size` as a request on the GPU would record it, with `slack` measured under the plan
    (the one `budget` chooses, if given: the fit counts the margin, so it is the same plan after)."""
    plan = make_plan(discover_model(model_dir), build_policy({}, 0, "dlo", "leading", 2))
    measured = profile_for(plan, size, GPU).profile
    assert measured is not None
    save_profile(measured.model_copy(update=dict(allocator_slack_bytes=None, measured_at="2026-12-02T00:00:00")))
    under = plan if budget is None else plan_for(plan.model, plan.policy, budget, size, GPU).plan
    save_profile(measured.model_copy(update=dict(allocator_slack_bytes=slack, allocator_slack_plan=plan_key(under),
                                                 measured_at="2026-12-02T00:00:00")))
    return plan


def test_the_forecast_after_a_request_counts_its_slack_and_only_at_that_size(demo_model_dir: Path):
    size = fill_size(discover_model(demo_model_dir), RequestSize(height=64, width=64))
    plan = _measured(demo_model_dir, size, 3 * GB)
    cached = forecast_for(plan, size, GPU)
    assert cached.peak_basis == "cached" and cached.allocator_slack == 3 * GB
    assert cached.process_peak_bytes == cached.peak_bytes + cached.overhead.context_bytes + 3 * GB
    other = forecast_for(plan, RequestSize(height=128, width=128), GPU)  # scaled from 64x64: no slack of its own
    assert other.allocator_slack is None
    assert other.process_peak_bytes == other.overhead.process_bytes(other.peak_bytes)


@pytest.mark.parametrize("change", [dict(resident_layers=2), dict(prefetch_slots=3), dict(vae_tiling="on"),
                                    dict(dlo_offload_components={"vae": False})])
def test_a_slack_measured_under_another_plan_is_not_counted(demo_model_dir: Path, change: dict):
    """Fragmentation follows the allocations, and they follow the plan: another plan gets the margin."""
    size = fill_size(discover_model(demo_model_dir), RequestSize(height=64, width=64))
    plan = _measured(demo_model_dir, size, 3 * GB)
    other = make_plan(plan.model, plan.policy.model_copy(update=change))
    assert plan_key(other) != plan_key(plan)
    forecast = forecast_for(other, size, GPU)
    assert forecast.peak_basis == "cached" and forecast.allocator_slack is None
    assert forecast.process_peak_bytes == forecast.overhead.process_bytes(forecast.peak_bytes)
    reordered = make_plan(plan.model, plan.policy)  # the same plan made again: its key, its slack
    assert forecast_for(reordered, size, GPU).allocator_slack == 3 * GB


def test_under_a_budget_the_forecast_and_the_runs_check_stay_inside_it(demo_model_dir: Path):
    size = fill_size(discover_model(demo_model_dir), RequestSize(height=64, width=64))
    budget = 2 * GB
    plan = _measured(demo_model_dir, size, 50 * GB, budget)  # an uncapped run that cached a lot
    planned = plan_for(plan.model, plan.policy, budget, size, GPU)
    assert planned.forecast is not None and planned.forecast.budget == budget
    assert planned.forecast.process_peak_bytes == budget  # the cap holds the allocator inside the budget
    check = ForecastCheck(request_id=1, predicted_peak=planned.forecast.peak_bytes, measured_peak=None,
                          peak_source="cached", predicted_step_s=None, measured_step_s=None, step_source="cached",
                          predicted_slack=planned.forecast.allocator_slack)
    memory = RunMemory(torch.device("cuda"), GPU, overhead=planned.forecast.overhead, budget=budget)
    assert memory.predicted(check, budget)["predicted_process_peak_bytes"] == budget  # run's figure: the plan's


def test_the_recorded_wan_8gb_repeat_is_within_3_percent_with_the_first_requests_slack():
    """The H200 run (benchmarks/results/real_cards-wan-2026-12-02-h200-8-repeat.json): the second request's
    forecast counted a 256 MB margin where the first request had measured 0.71 GB reserved above allocated
    (tiled decode), and was 8 % low; with the measured slack it is within the 3 % target."""
    doc = json.loads((RESULTS / "real_cards-wan-2026-12-02-h200-8-repeat.json").read_text())
    first, second = doc["cards"][0]["rounds"]
    slack = first["run"]["reserved_peak"] - first["run"]["allocated_peak"]
    overhead = DeviceOverhead(second["run"]["context_bytes"], "measured", GPU)
    budget = int(doc["cards"][0]["card_gb"] * GB)
    allocated = second["plan"]["predicted_allocated_peak"]
    measured = second["run"]["measured_process_peak"]
    before = overhead.process_bytes(allocated)
    after = overhead.process_bytes(allocated, slack, budget)
    assert abs(before - measured) / measured > 0.03  # what the run found
    assert abs(after - measured) / measured <= 0.03


def test_the_plans_reason_line_and_its_forecast_give_the_same_process_figure(demo_model_dir: Path):
    size = fill_size(discover_model(demo_model_dir), RequestSize(height=64, width=64))
    plan = _measured(demo_model_dir, size, GB, 3 * GB)
    planned = plan_for(plan.model, plan.policy, 3 * GB, size, GPU)
    shown = fp.format_bytes(planned.forecast.process_peak_bytes)
    line = next(r for r in planned.reasons if "device memory of the process" in r)
    assert f"device memory of the process {shown} of" in line
    outside = next(r for r in planned.reasons if r.startswith("outside torch's allocations"))
    assert "allocator cache 1.0 GB (reserved above allocated, measured by a request of this size under this plan)" \
        in outside
    other = plan_for(plan.model, plan.policy, 3 * GB, RequestSize(height=128, width=128), GPU)  # scaled: no cache
    assert other.forecast.allocator_slack is None
    assert not any("allocator cache" in r for r in other.reasons)


def test_the_recorded_flux_12gb_auto_repeat_is_within_3_percent_with_the_margin():
    """The H200 run (benchmarks/results/real_cards-flux-2026-12-02-h200-12-auto-repeat-reserved.json): the first
    request (14 resident blocks) left 0.51 GB reserved above allocated, the second plan (15 blocks) 0.06 GB.
    Counting the first plan's slack put the second forecast 3.5 % high; with the margin it is within 3 %."""
    doc = json.loads((RESULTS / "real_cards-flux-2026-12-02-h200-12-auto-repeat-reserved.json").read_text())
    first, second = doc["cards"][0]["rounds"]
    assert first["plan"]["policy"] != second["plan"]["policy"]  # the planner moved with the measured profile
    slack = first["run"]["reserved_peak"] - first["run"]["allocated_peak"]
    overhead = DeviceOverhead(second["run"]["context_bytes"], "measured", GPU)
    budget = second["run"]["allocator_cap"] + second["run"]["context_bytes"]  # the cap: budget - context
    allocated = second["plan"]["predicted_allocated_peak"]
    measured = second["run"]["measured_process_peak"]
    assert abs(overhead.process_bytes(allocated, slack, budget) - measured) / measured > 0.03  # the other plan's
    assert abs(overhead.process_bytes(allocated) - measured) / measured <= 0.03


def test_a_request_records_its_slack_with_its_plans_key(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """The engine's recorder keeps the slack a request measured with the key of the plan it ran under, and
    the next forecast counts it for that plan only (a CPU has no allocator figures: the run's are injected)."""
    monkeypatch.setattr(runner.RunOutput, "allocator_slack", property(lambda run: 123_456_789))
    gen = dict(FAMILY_GENERATION["flux"])
    steps, height, width = gen.pop("num_inference_steps"), gen.pop("height"), gen.pop("width")
    engine = Engine(demo_model_dir, device="cpu")
    try:
        size = fill_size(engine.model, RequestSize(height=height, width=width))
        budget = engine.model.nbytes * 6 // 5  # half the blocks stream
        planned = plan_for(engine.model, build_policy({}, 0), budget, size, "cpu").plan  # what `run` loads
        assert 0 < planned.residency.num_resident < planned.residency.num_blocks
        engine.load(planned.policy)
        assert plan_key(engine.plan) == plan_key(planned)  # the loaded plan has the key `plan` gives it
        engine.generate(GenerateRequest(prompt="a fox", steps=steps, height=height, width=width, seed=3, extra=gen))
        profile = profile_for(engine.plan, size, "cpu").profile
        assert profile is not None and profile.allocator_slack_bytes == 123_456_789
        assert profile.allocator_slack_plan == plan_key(engine.plan)
        assert forecast_for(engine.plan, size, "cpu").allocator_slack == 123_456_789
        other = make_plan(engine.model, planned.policy.model_copy(
            update=dict(resident_layers=planned.residency.num_resident + 1)))
        assert forecast_for(other, size, "cpu").allocator_slack is None
    finally:
        engine.close()
