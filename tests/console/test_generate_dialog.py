"""The generate dialog remembers the last request's values per model, shows the request's forecast
before Enter (updated as fields change), and on a CPU starts from a small request."""

from __future__ import annotations

from dataclasses import replace

import pytest
from app_helpers import finish, load, until
from textual.widgets import Input, Static

from omni_console.console.request_defaults import (
    CPU_SIDE,
    CPU_STEPS,
    FORECASTING_LINE,
    forecast_line,
    small_request,
)
from omni_console.console.screens import GenerateDialog, LiveScreen
from omni_console.engine.engine import Engine
from omni_console.engine.planning.request_forecast import forecast_for
from omni_console.engine.planning.request_profile import RequestSize


def forecast_text(dialog: GenerateDialog) -> str:
    return str(dialog.query_one("#gen-forecast", Static).render())


@pytest.mark.slow
async def test_the_dialog_forecasts_before_enter_and_remembers_the_last_values(app, monkeypatch, tmp_path):
    # a cache of its own: a profile another test recorded for the demo would be scaled into an estimate
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, GenerateDialog))
        dialog = app.screen
        # the line comes from the engine thread (it reads the profile cache): nothing measured yet, not invented
        await until(pilot, lambda: forecast_text(dialog) != FORECASTING_LINE, limit=2000)
        assert forecast_text(dialog).startswith("forecast: unknown")
        known = replace(forecast_for(app.engine.plan, RequestSize(), "cpu"), step_s=0.5, step_source="cached")
        monkeypatch.setattr(app.engine, "forecast", lambda size, *a, **k: known)  # as if a profile were cached now
        await pilot.press("escape")  # nothing runs while a dialog is open: a new one asks the engine again
        await until(pilot, lambda: isinstance(app.screen, LiveScreen))
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, GenerateDialog))
        dialog = app.screen
        dialog.query_one("#steps", Input).value = "3"
        await until(pilot, lambda: forecast_text(dialog) == "forecast: 3 steps × 500.0 ms = 1.50 s denoising (cached)")
        dialog.query_one("#seed", Input).value = "7"
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, LiveScreen))
        await finish(pilot, app.last_command["generate"], lambda: not app.generating)
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, GenerateDialog))
        again = app.screen
        assert again.query_one("#steps", Input).value == "3" and again.query_one("#seed", Input).value == "7"
        assert again.query_one("#size", Input).value == "64x64"


def test_forecast_line_says_unknown_rather_than_a_made_up_time():
    assert forecast_line(None, 4).startswith("forecast: unknown")


def test_a_cpu_starts_a_video_pipeline_small(wan_model_dir):
    engine = Engine(wan_model_dir, device="cpu")
    try:
        request = small_request(engine, "a cat")
    finally:
        engine.close()
    assert request.steps == CPU_STEPS and request.height == request.width == CPU_SIDE
    assert request.frames == 9  # Wan renders 4k+1 frames exactly
