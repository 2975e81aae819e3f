"""`run`'s plan is the engine's: the budget's choice, its reasons and the lean phases come from
`service.plan_run` as `plan_for` decides them, with the lines the CLI prints, in the order it prints them."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_console.engine.api import GenerateRequest, checks, open_engine, planner, service


@pytest.mark.slow
def test_plan_run_is_plan_for_with_its_lines(demo_model_dir: Path) -> None:
    engine = open_engine(demo_model_dir, device="cpu")
    try:
        plan = engine.make_plan(planner.build_policy())
        request = GenerateRequest(prompt="a", height=64, width=64)
        free = service.plan_run(engine, plan, None, None, request)
        assert free.plan is plan and free.policy is plan.policy and free.reasons == [] and free.overhead is None
        assert free.notes == [f"lean phase: {line}" for line in free.lean]
        budget = engine.model.nbytes * 2
        capped = service.plan_run(engine, plan, budget, None, request)
        direct = planner.plan_for(engine, plan, budget, checks.request_size(request), live=True)
        assert capped.reasons and capped.reasons == direct.reasons and capped.policy == direct.plan.policy
        assert capped.notes == [f"--vram-budget: {line}" for line in capped.reasons]  # the reasons say the lean
        assert capped.overhead == direct.overhead
    finally:
        engine.close()


def test_run_options_keep_live_masters_only_under_a_device_budget_alone() -> None:
    assert service.run_options(None, None).live_replan is False
    assert service.run_options(10**9, None).live_replan is True
    assert service.run_options(10**9, 10**10).live_replan is False
