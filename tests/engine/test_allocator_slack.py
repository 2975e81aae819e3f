"""After one request of a size, the process forecast counts what the caching allocator held above its
allocated peak (cache and fragmentation), as that request measured it; under a budget it stays inside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from omni_console.console.run_memory import RunMemory
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
from omni_console.engine.running.runner import RunOutput
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


def _measured(model_dir: Path, size: RequestSize, slack: int):
    """A profile of `size` as a request on the GPU would record it, with `slack`."""
    plan = make_plan(discover_model(model_dir), build_policy({}, 0, "dlo", "leading", 2))
    measured = profile_for(plan, size, GPU).profile
    assert measured is not None
    save_profile(measured.model_copy(update=dict(allocator_slack_bytes=slack, measured_at="2026-12-02T00:00:00")))
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


def test_under_a_budget_the_forecast_and_the_runs_check_stay_inside_it(demo_model_dir: Path):
    size = fill_size(discover_model(demo_model_dir), RequestSize(height=64, width=64))
    plan = _measured(demo_model_dir, size, 50 * GB)  # an uncapped run that cached a lot
    budget = 2 * GB
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
    plan = _measured(demo_model_dir, size, GB)
    planned = plan_for(plan.model, plan.policy, 3 * GB, size, GPU)
    shown = fp.format_bytes(planned.forecast.process_peak_bytes)
    line = next(r for r in planned.reasons if "device memory of the process" in r)
    assert f"device memory of the process {shown} of" in line
    outside = next(r for r in planned.reasons if r.startswith("outside torch's allocations"))
    assert "allocator cache 1.0 GB (reserved above allocated, measured by a request of this size)" in outside
    other = plan_for(plan.model, plan.policy, 3 * GB, RequestSize(height=128, width=128), GPU)  # scaled: no cache
    assert other.forecast.allocator_slack is None
    assert not any("allocator cache" in r for r in other.reasons)
