"""The TUI and `run` give the same report for the same request: both are the engine's one builder
(engine/service/report.py), fed the same way (console/request_report.py for the TUI, headless.py for `run`).

Compared with the fields that measure this machine's clock or the face removed (VOLATILE, each with why);
everything else (forecast, policy, plan, steps and their transfers, frames, files' count, the forecast
check's predictions, notes, memory notes, staging totals' counts and bytes, lean phases) must be equal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from app_helpers import finish, load, make_app

from omni_console.console.cli import main
from omni_console.console.headless import default_request
from omni_console.engine.engine import Engine

VOLATILE = {
    # wall-clock times: two runs never take the same seconds
    "load_seconds", "load_phases", "load_milestones", "request_seconds", "phases",
    # where each face writes: `run` to --output, the TUI to a new timestamped name in its folder
    "output", "files",
    # telemetry samples (a sampler at its own rate; the TUI's injected fixed sources vs the machine's)
    "telemetry",
    # the log lines a face's subscription saw: the TUI's covers the console's own start (imports, forecasts)
    "log", "log_lines_total", "events_dropped",
    # the process's measured host RSS peak (and its error against the forecast): the TUI's process also holds
    # Textual and the app's widgets
    "host_peak_bytes", "host_peak_error",
}
VOLATILE_IN = {
    "steps": {"wall_s", "stall_s"},  # per-step clock figures (the step count and bytes stay)
    "staging": {"h2d_seconds", "h2d_bytes_per_s"},  # the copies' clock (their count and bytes stay)
    "forecast_check": {"measured_step_s", "step_error", "measured_peak_bytes", "peak_error"},  # measured per run
}


def stable(report: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in report.items() if k not in VOLATILE}
    for key, fields in VOLATILE_IN.items():
        value = kept.get(key)
        if isinstance(value, list):
            kept[key] = [{k: v for k, v in item.items() if k not in fields} for item in value]
        elif isinstance(value, dict):
            kept[key] = {k: v for k, v in value.items() if k not in fields}
    return kept


@pytest.mark.slow
async def test_the_tui_and_run_report_the_same_request_the_same_way(demo_model_dir, tmp_path, monkeypatch, capsys):
    # each face with a fresh cache of its own: a forecast made after the other's request would read the
    # profile that request cached (its source "cached", not "default")
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache-run"))
    out = tmp_path / "run.png"
    assert main(["run", "--model", str(demo_model_dir), "--output", str(out), "--prompt", "a blue teapot",
                 "--height", "64", "--width", "64", "--steps", "2", "--seed", "3", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache-tui"))
    engine = Engine(demo_model_dir, device="cpu")
    app = make_app(engine, tmp_path)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await load(pilot, app)
            request = default_request(engine, prompt="a blue teapot", steps=2, height=64, width=64, seed=3)
            await finish(pilot, app.start_generate(request), lambda: not app.generating)
    finally:
        app.shutdown()
        engine.close()
    tui = app.service.history.entries[-1].report
    assert tui is not None
    assert set(tui) == set(cli)  # the same document, field for field
    assert Path(tui["output"]).parent == tmp_path / "out" and cli["output"] == str(out)
    assert len(tui["files"]) == len(cli["files"]) == 1
    assert stable(tui) == stable(cli)
