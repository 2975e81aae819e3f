"""q is a priority binding (checked when the key arrives, not after it has bubbled up from the focused
panel, one event-loop turn per widget: seconds while a CPU request starves the UI), yet a text field still
gets the letter; ctrl+q quits from anywhere."""

from __future__ import annotations

import pytest
from app_helpers import load, press_quit, until
from textual.widgets import Input


@pytest.mark.slow
async def test_q_typed_into_the_filter_field_is_text_not_quit(app):
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        await pilot.press("slash")
        await until(pilot, lambda: isinstance(app.focused, Input))
        await pilot.press("q", "u", "q")
        await until(pilot, lambda: app.focused.value == "quq")
        assert app.is_running and app.return_value is None and app.phase == "live"
        await press_quit(pilot, app, "ctrl+q")
        assert app.return_value == 0


@pytest.mark.slow
async def test_q_quits_from_the_focused_staging_log_at_once(app):
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        assert app.focused is not None and not isinstance(app.focused, Input)
        await press_quit(pilot, app)
        assert app.return_value == 0
        assert app.worker._closed  # the release is queued; the process waits for it after the terminal is back


def test_the_process_waits_for_the_release_only_when_there_is_something_to_release():
    from types import SimpleNamespace

    from omni_console.console.shutdown import release_wait_s
    from omni_console.engine.lifecycle import EngineState

    def wait(state: EngineState, world: int = 1) -> float:
        return release_wait_s(SimpleNamespace(state=state, world=world), 0.8)

    assert wait(EngineState.DISCOVERED) == 0.0  # the plan screen: its release would queue behind prepare's import
    assert wait(EngineState.UNLOADED) == 0.0
    assert wait(EngineState.LOADING) == wait(EngineState.READY) == wait(EngineState.RUNNING) == 0.8
    assert wait(EngineState.DISCOVERED, world=2) == 0.8  # a rank group's release stops its processes
