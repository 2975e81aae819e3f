"""The console on two ranks (`--gpus 2`; gloo processes on a CPU): the rank processes start while the
plan is shown and the load only reads, a request saves one image per rank's seed, a rank that dies
is one line and the plan screen again, and quitting leaves no rank process behind."""

from __future__ import annotations

import time

import pytest
from app_helpers import finish, load, press_quit, screen_text, until
from textual.widgets import Input

from omni_console.console.app_main import build_app
from omni_console.console.cli import build_parser
from omni_console.console.screens import GenerateDialog, PlanScreen
from omni_console.engine.engine import EngineState
from omni_console.engine.ranks.group_engine import GroupEngine
from omni_console.offload.events import LogEvent

pytestmark = pytest.mark.slow  # end to end (spawns rank processes): .ci/run runs it, `pytest -q` skips it


def group_app(demo_model_dir, tmp_path, *extra: str):
    args = build_parser().parse_args(["console", "--model", str(demo_model_dir), "--gpus", "2", *extra])
    app = build_app(args)
    app.out_dir = tmp_path / "out"
    app.start_telemetry = False  # the ranks' own samplers still run
    return app


def gone(procs) -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(p.is_alive() for p in procs):
        time.sleep(0.1)
    return not any(p.is_alive() for p in procs)


async def generate(pilot, app, steps: str = "2") -> None:
    before = app.last_command.get("generate")
    await pilot.press("g")
    await until(pilot, lambda: isinstance(app.screen, GenerateDialog))
    app.screen.query_one("#steps", Input).value = steps
    await pilot.press("enter")
    await until(pilot, lambda: app.last_command.get("generate") is not before)
    await finish(pilot, app.last_command["generate"], lambda: not app.generating)


async def test_two_ranks_load_generate_and_quit_leave_nothing_behind(demo_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the user log directory, here
    app = group_app(demo_model_dir, tmp_path)
    engine = app.engine
    assert isinstance(engine, GroupEngine) and engine.world == 2
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        deadline = time.monotonic() + 120
        while engine.group is None and time.monotonic() < deadline:  # started while the plan is shown
            await pilot.pause(0.1)
        ahead = list(engine.group._procs)
        await load(pilot, app)
        assert engine.state == EngineState.READY
        procs = list(engine.group._procs)
        assert procs == ahead and len(procs) == 2 and all(p.is_alive() for p in procs)  # the load only read
        await until(pilot, lambda: "GPU 0" in screen_text(app) and "GPU 1" in screen_text(app))
        await generate(pilot, app)
        saved = sorted((tmp_path / "out").iterdir())
        assert len(saved) == 2, saved  # seed and seed + 1, one per rank
        assert any("rank 1: saved" in line for line in app.live_screen.staging.lines)
        await press_quit(pilot, app)
    app.shutdown()
    assert gone(procs) and engine.group is None
    logs = sorted(p.name for p in (tmp_path / "state" / "omni-console" / "log").iterdir())
    assert [name.split("-")[0] for name in logs] == ["rank0", "rank1"]  # each rank's own output, not the terminal


async def test_quitting_while_the_ranks_start_stops_them(demo_model_dir, tmp_path, monkeypatch):
    import multiprocessing

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    app = group_app(demo_model_dir, tmp_path)
    events = app.engine.bus.subscribe()
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not [p for p in multiprocessing.active_children()
                                                   if p.name.startswith("omni-rank")]:
            await pilot.pause(0.05)
        ranks = [p for p in multiprocessing.active_children() if p.name.startswith("omni-rank")]
        assert len(ranks) == 2 and app.engine.group is None  # spawned, not yet ready
        await press_quit(pilot, app)
    app.shutdown()
    assert gone(ranks) and app.engine.group is None
    lines = [e.message for e in events.drain() if isinstance(e, LogEvent)]
    assert "ranks not started ahead of the load: start cancelled: every rank stopped" in lines  # not waited for


async def test_a_rank_that_dies_is_one_line_and_the_plan_screen(demo_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    app = group_app(demo_model_dir, tmp_path)
    engine = app.engine
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await load(pilot, app)
            procs = list(engine.group._procs)
            procs[1].kill()
            await generate(pilot, app)
            await until(pilot, lambda: isinstance(app.screen, PlanScreen), limit=400)
            assert engine.state == EngineState.FAILED and "rank 1 exited" in engine.failure
            message, severity = app.notices[-1]
            assert "rank 1 exited" in message and "press l to load again" in message and severity == "error"
            assert gone(procs)
            await load(pilot, app)  # the operator loads again
            assert engine.state == EngineState.READY
            await until(pilot, lambda: "GPU 1" in screen_text(app))  # the new group's panel
    finally:
        app.shutdown()


def test_gpus_with_a_vram_budget_is_refused_before_anything_starts(demo_model_dir, capsys):
    from omni_console.console.cli import main

    code = main(["console", "--model", str(demo_model_dir), "--gpus", "2", "--vram-budget", "10GB"])
    assert code == 2 and "--vram-budget with --gpus" in capsys.readouterr().err


@pytest.mark.parametrize("gpus", ["3"])
def test_more_ranks_than_cores_is_refused(demo_model_dir, capsys, gpus):
    import os

    from omni_console.console.cli import main

    if (os.cpu_count() or 1) >= int(gpus):
        pytest.skip("this machine has enough cores for 3 gloo ranks")
    code = main(["console", "--model", str(demo_model_dir), "--gpus", gpus])
    assert code == 2 and "--gpus" in capsys.readouterr().err
