"""Snapshot tests (pytest-textual-snapshot): the plan and live screens at 80x24 and 160x48 in each theme.

Everything on screen is made stable: the demo model is copied to a relative path (`demo-flux`, so no
machine's temp directory shows), telemetry comes from fixed sources, the live screen's staging log
and step table are filled with fixed events, and wall-clock figures (load time) are cleared.
Regenerate after an intended change with `pytest tests/console/test_snapshots.py --snapshot-update`
and look at the SVGs in `__snapshots__/` before committing them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from app_helpers import forecast_shown, make_app, until

from omni_console.console.request_defaults import FORECASTING_LINE
from omni_console.engine.engine import Engine
from omni_console.engine.events import StepTiming
from omni_console.offload.events import StagingEvent
from omni_console.themes import THEMES

SIZES = [(80, 24), (160, 48)]
THEME_NAMES = sorted(THEMES)


@pytest.fixture
def stable_engine(demo_model_dir, tmp_path, monkeypatch):
    """The demo model under the relative path `demo-flux`: the header and the serve line show that."""
    shutil.copytree(demo_model_dir, tmp_path / "demo-flux")
    monkeypatch.chdir(tmp_path)
    engine = Engine(Path("demo-flux"), device="cpu")
    yield engine
    engine.close()


def stable_app(engine, tmp_path, theme):
    return make_app(engine, tmp_path, theme=theme)


async def settle_plan(pilot) -> None:
    app = pilot.app
    await pilot.pause()
    app.sampler.sample_now(publish=True)  # the fixed host memory, not this machine's, in the header
    app.drain_events()
    app.refresh_plan_views()
    await forecast_shown(pilot, app)  # the request forecast from the engine thread, never a "forecasting…" frame


FIXED_EVENTS = [
    StagingEvent(t=100.0, target="text_encoder", direction="h2d", nbytes=172_000, seconds=0.0021),
    StagingEvent(t=100.5, target="transformer.transformer_blocks.0", direction="h2d", nbytes=370_000, seconds=0.0013),
    StagingEvent(t=101.0, target="text_encoder", direction="d2h", nbytes=0, seconds=0.0001),
]
FIXED_STEPS = [StepTiming(t=101.0 + i, request_id=1, step=i + 1, total_steps=2, wall_s=0.25 + i * 0.01,
                          stall_s=0.05) for i in range(2)]


async def settle_live(pilot) -> None:
    """Load, then replace everything the clock wrote (event times, durations, load time) with fixed data."""
    app = pilot.app
    await settle_plan(pilot)
    await pilot.press("l")
    await until(pilot, lambda: app.phase == "live" and app.screen is app.live_screen, limit=2000)
    await pilot.pause()
    live = app.live_screen
    app.drain_events()
    app.load_seconds = None
    app._live_status()
    live.staging.clear()
    live.staging._t0 = FIXED_EVENTS[0].t
    live.staging.add_events(FIXED_EVENTS)
    live.add_steps(FIXED_STEPS)
    app.sampler.sample_now(publish=True)
    app.drain_events()
    app.clear_notifications()
    await pilot.pause()


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("theme", THEME_NAMES)
def test_plan_screen_snapshot(snap_compare, stable_engine, tmp_path, theme, size):
    app = stable_app(stable_engine, tmp_path, theme)
    try:
        assert snap_compare(app, terminal_size=size, run_before=settle_plan)
    finally:
        app.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("theme", THEME_NAMES)
def test_live_screen_snapshot(snap_compare, stable_engine, tmp_path, theme, size):
    app = stable_app(stable_engine, tmp_path, theme)
    try:
        assert snap_compare(app, terminal_size=size, run_before=settle_live)
    finally:
        app.shutdown()


async def open_help(pilot) -> None:
    await settle_plan(pilot)
    await pilot.press("question_mark")
    await pilot.pause()


async def open_generate(pilot) -> None:
    await settle_live(pilot)
    await pilot.press("g")
    await until(pilot, lambda: type(pilot.app.screen).__name__ == "GenerateDialog")
    await until(pilot, lambda: pilot.app.screen.forecast_text != FORECASTING_LINE, limit=2000)  # the engine's answer
    await pilot.pause()


@pytest.mark.slow
@pytest.mark.parametrize("name, run_before", [("help", open_help), ("generate", open_generate)])
def test_dialog_snapshot_at_80x24(snap_compare, stable_engine, tmp_path, name, run_before):
    """The help screen (over the plan screen) and the generate dialog (over the live screen) at 80x24."""
    app = stable_app(stable_engine, tmp_path, "omni-dark")
    try:
        assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
    finally:
        app.shutdown()
