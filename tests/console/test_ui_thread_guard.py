"""The UI thread never calls into the engine: checked by type, at run time.

Every `EngineHandle` method of the `Engine` class records the thread it runs on while the app is driven
through a whole session (open, plan edits, load, generate, unload, quit). Whatever a module names its
variable, a call reaches the class, so only the engine's worker thread may appear.
(test_session.py's static guard reads the source for the same rule, which needs no model.)
"""

from __future__ import annotations

import inspect
import threading

import pytest
from app_helpers import finish, forecast_shown, load, make_app, until
from textual.widgets import Input

from omni_console.console.screens import GenerateDialog, PlanScreen
from omni_console.engine.api import EngineHandle
from omni_console.engine.engine import Engine

WORKER_THREAD = "omni-engine"  # engine.worker.EngineWorker's thread


@pytest.mark.slow
async def test_every_call_into_the_engine_runs_on_the_engines_thread(engine, tmp_path, monkeypatch):
    methods = sorted(n for n, v in vars(EngineHandle).items() if inspect.isfunction(v) and not n.startswith("_"))
    assert {"make_plan", "forecast", "load", "generate", "replan", "unload", "close"} <= set(methods)
    calls: list[tuple[str, str]] = []

    def recording(name: str):
        original = getattr(Engine, name)

        def call(self, *args, **kwargs):
            calls.append((name, threading.current_thread().name))
            return original(self, *args, **kwargs)

        return call

    for name in methods:
        monkeypatch.setattr(Engine, name, recording(name))
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(200, 60)) as pilot:
        await forecast_shown(pilot, app)
        await pilot.press("plus", "minus", "j", "space")  # plan edits: planned on the UI thread, from the model
        await forecast_shown(pilot, app)
        await load(pilot, app)
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, GenerateDialog))
        app.screen.query_one("#steps", Input).value = "1"
        app.screen.query_one("#prompt", Input).value = "a red cube"
        await pilot.press("enter")
        await finish(pilot, app.last_command["generate"], lambda: not app.generating)
        await pilot.press("u")
        await finish(pilot, app.last_command["unload"], lambda: isinstance(app.screen, PlanScreen))
    app.shutdown()
    called = {name for name, _ in calls}
    assert {"forecast", "load", "generate", "unload"} <= called, calls
    assert [(name, thread) for name, thread in calls if thread != WORKER_THREAD] == []
