"""One way to a forecast: `plan` (the CLI) and the console (its plan screen and generate dialog ask
`Engine.forecast` on the engine thread) give the same request forecast for the same request, because
`Engine.forecast` asks `plan_for`, which `plan` prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_console.console.cli import main
from omni_console.console.plan_commands import request_forecast_of
from omni_console.engine import engine as engine_module
from omni_console.engine.api import EngineOptions, RequestSize, open_engine, planner
from omni_console.engine.planning.export import request_forecast_doc


def plan_forecast(capsys, model: Path, *flags: str) -> dict:
    assert main(["plan", "--model", str(model), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)["request_forecast"]


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "size"), [
    ((), RequestSize()),
    (("--height", "48", "--width", "80", "--guidance", "2"), RequestSize(height=48, width=80, guidance=2.0)),
])
def test_plan_and_the_console_give_one_forecast(demo_model_dir: Path, tmp_path: Path, capsys, monkeypatch, flags,
                                                 size) -> None:
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))  # no profile an earlier test measured
    printed = plan_forecast(capsys, demo_model_dir, *flags)
    asked = []
    real = engine_module.plan_for
    monkeypatch.setattr(engine_module, "plan_for", lambda *a, **k: asked.append(k) or real(*a, **k))
    for live in (False, True):  # the console loads for live re-plan: its host counts the masters, as it will hold them
        engine = open_engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=live))
        try:
            plan = engine.make_plan(planner.build_policy())
            forecast = request_forecast_of(size, plan, None)(engine)
        finally:
            engine.close()
        shown = json.loads(request_forecast_doc(forecast, "cpu").model_dump_json(by_alias=True))
        assert shown["peak_bytes"] == printed["peak_bytes"] > 0
        if live:
            assert shown["host"]["live_replan"] and not printed["host"]["live_replan"]
            shown.pop("host"), printed.pop("host")
        assert shown == printed
    assert [k["live"] for k in asked] == [False, True]  # each forecast went through plan_for
