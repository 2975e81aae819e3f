"""`console --vram-budget`: the app starts with the planner's policy for the pipeline's default request
(`plan_for` with `RequestSize()`), the same one `plan --vram-budget` chooses without a size."""

from __future__ import annotations

from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.auto_plan import auto_plan_for
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.request_profile import RequestSize
from omni_console.offload.policy import build_policy


def test_the_console_starts_with_the_budgets_policy(demo_model_dir):
    from omni_console.console.app_main import build_app
    from omni_console.console.cli import build_parser

    model = discover_model(demo_model_dir)
    budget = model.nbytes  # less than the whole model and its activations: the planner must choose
    args = build_parser().parse_args(["console", "--model", str(demo_model_dir), "--vram-budget", f"{budget}B"])
    app = build_app(args)
    try:
        expected = auto_plan_for(make_plan(model, build_policy()), budget, RequestSize(), app.engine.device_name)
        assert app.policy == expected.plan.policy
    finally:
        app.shutdown()
