"""Under `--ram-budget`, blocks read from the page cache or the disk each forward bound the step: the forecast's
step floor is at least the host tiers' transfer, not only the link's (a Flux-size DiT on a 16 GB host ran its step
at the tiers' figure, 18x what the link alone forecast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.plan_flow import plan_for
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.profile_basis import profile_for
from omni_console.engine.planning.request_forecast import forecast_for
from omni_console.engine.planning.request_profile import RequestSize
from omni_console.offload.policy import build_policy

GPU = "NVIDIA H200"  # a device the throughput table names: its step time is estimated
SIZE = RequestSize(height=64, width=64)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))


def _plan(model_dir: Path):
    return make_plan(discover_model(model_dir), build_policy({}, 0, "dlo", "leading", 2))


def test_tier_reads_slower_than_the_link_become_the_step_floor(demo_model_dir: Path) -> None:
    plan = _plan(demo_model_dir)
    link_only = forecast_for(plan, SIZE, GPU)
    assert link_only.floor_s is not None and link_only.step_s is not None
    forwards = profile_for(plan, SIZE, GPU).profile.forwards_per_step
    slow = link_only.floor_s * 50  # one forward's reads from disk, far over the link's copies
    tiered = forecast_for(plan, SIZE, GPU, tier_transfer_s=slow)
    assert tiered.floor_s == pytest.approx(slow * forwards)
    assert tiered.step_s >= tiered.floor_s
    assert any("host tiers' reads" in note for note in tiered.notes)
    fast = forecast_for(plan, SIZE, GPU, tier_transfer_s=0.0)  # reads hidden behind the link: nothing changes
    assert (fast.floor_s, fast.step_s) == (link_only.floor_s, link_only.step_s)


def test_plan_for_a_ram_budget_puts_its_tiers_in_the_step_floor(demo_model_dir: Path) -> None:
    model = discover_model(demo_model_dir)
    planned = plan_for(model, build_policy({}, 0, "dlo", "leading", 2), size=SIZE, device=GPU, ram_budget=3 * 10**9)
    assert planned.ram is not None and planned.forecast is not None and planned.forecast.floor_s is not None
    forwards = profile_for(planned.plan, SIZE, GPU).profile.forwards_per_step
    assert planned.forecast.floor_s >= planned.ram.choice.cost.transfer_seconds * forwards
