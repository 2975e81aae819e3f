"""Pilot tests: the console's requests go through the engine's request service — `g` while a request runs
queues the next, the queue panel cancels and reorders, the history survives a restart and re-runs a
request with `enter`, and a history file that cannot be used is one note."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from app_helpers import finish, hold_first_step, load, make_app, screen_text, until
from textual.widgets import Input

from omni_console.console.headless import default_request
from omni_console.console.screens import GenerateDialog, HistoryScreen
from omni_console.engine.engine import Engine
from omni_console.engine.service.history import MAX_BYTES


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def held_first_step(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """(entered, release): the first request waits inside its first step until the test releases it."""
    return hold_first_step(monkeypatch)


def queue_rows(app) -> list[list[str]]:
    """The queue panel's rows as words (every request here is 64x64)."""
    return [line.strip(" │").split() for line in screen_text(app).splitlines() if "64x64" in line]


def history_prompts(cache: Path) -> list[tuple[str, str]]:
    entries = json.loads((cache / "history.json").read_text())["entries"]
    return [(e["request"]["prompt"], e["status"]) for e in entries]


@pytest.mark.slow
async def test_three_queued_requests_cancel_the_second_while_the_first_runs_and_reorder(
        engine, tmp_path, cache, held_first_step):
    entered, release = held_first_step
    app = make_app(engine, tmp_path)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await load(pilot, app)
            first = app.start_generate(default_request(engine, prompt="first", steps=1))
            assert await asyncio.to_thread(entered.wait, 30)  # the first runs, held in its step
            second = app.start_generate(default_request(engine, prompt="second", steps=1))
            third = app.start_generate(default_request(engine, prompt="third", steps=1))
            # g while a request runs opens the dialog; enter queues a fourth
            await pilot.press("g")
            await until(pilot, lambda: isinstance(app.screen, GenerateDialog))
            app.screen.query_one("#prompt", Input).value = "fourth"
            app.screen.query_one("#steps", Input).value = "1"
            await pilot.press("enter")
            await until(pilot, lambda: app.screen is app.live_screen and "fourth" in screen_text(app))
            fourth = app.last_command["generate"]
            text = screen_text(app)
            assert "queue: 3 waiting" in text
            rows = queue_rows(app)
            assert [r[:3] for r in rows] == [["▶", "running", "first"], ["1", "queued", "second"],
                                             ["2", "queued", "third"], ["3", "queued", "fourth"]], rows

            panel = app.live_screen.queue
            panel.focus()
            await pilot.press("down", "x")  # the second request: removed before it ran
            await until(pilot, lambda: "second" not in screen_text(app))
            assert second.cancelled() and not first.done()
            await pilot.press("down", "left_square_bracket")  # the fourth before the third
            await until(pilot, lambda: [t.request.prompt for t in app.service.waiting()] == ["fourth", "third"])
            await until(pilot, lambda: [r[:3] for r in queue_rows(app)] == [
                ["▶", "running", "first"], ["1", "queued", "fourth"], ["2", "queued", "third"]])
            release.set()
            for future in (first, fourth, third):
                await finish(pilot, future, lambda: True)
            await until(pilot, lambda: not app.generating and not app.service.waiting())
            await until(pilot, lambda: "queue:" not in screen_text(app))  # the panel hides when empty
    finally:
        release.set()
        app.shutdown()
    # the requests ran in the queue's order; the one removed before it ran is not in the history
    assert history_prompts(cache) == [("first", "done"), ("fourth", "done"), ("third", "done")]
    assert len(list((tmp_path / "out").glob("*.png"))) == 3


@pytest.mark.slow
async def test_the_history_survives_a_restart_and_enter_runs_a_request_again(demo_model_dir, tmp_path, cache):
    engine = Engine(demo_model_dir, device="cpu")
    app = make_app(engine, tmp_path)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await load(pilot, app)
            future = app.start_generate(default_request(engine, prompt="a green kettle", steps=1, seed=7))
            await finish(pilot, future, lambda: not app.generating)
    finally:
        app.shutdown()
        engine.close()
    # a new console (a new engine, a new app) reads what the first one served
    engine = Engine(demo_model_dir, device="cpu")
    app = make_app(engine, tmp_path)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await load(pilot, app)
            app.action_history()
            await until(pilot, lambda: isinstance(app.screen, HistoryScreen))
            await pilot.pause()
            row = next(line for line in screen_text(app).splitlines() if "a green kettle" in line)
            assert "done" in row and "64x64" in row
            await pilot.press("enter")
            await until(pilot, lambda: app.screen is app.live_screen)
            await finish(pilot, app.last_command["generate"], lambda: not app.generating)
    finally:
        app.shutdown()
        engine.close()
    entries = json.loads((cache / "history.json").read_text())["entries"]
    assert [(e["request"]["prompt"], e["request"]["seed"], e["request"]["steps"], e["status"]) for e in entries] == [
        ("a green kettle", 7, 1, "done")] * 2
    assert entries[0]["files"] != entries[1]["files"]  # a new file: the first one is never replaced
    assert all(Path(e["files"][0]).is_file() for e in entries)


@pytest.mark.slow
@pytest.mark.parametrize("content", [b"\x00not json", b" " * (MAX_BYTES + 1)], ids=["corrupt", "huge"])
async def test_a_corrupt_or_huge_history_is_ignored_with_one_note_and_replaced_by_the_next_request(
        engine, tmp_path, cache, content):
    cache.mkdir()
    (cache / "history.json").write_bytes(content)
    app = make_app(engine, tmp_path)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await load(pilot, app)
            notes = [m for m, _ in app.notices if "history" in m and "ignored" in m]
            assert len(notes) == 1, app.notices
            reason = "is not a valid history file" if content.startswith(b"\x00") else f"is larger than {MAX_BYTES}"
            assert f"history {cache / 'history.json'} ignored: {reason}" in notes[0]
            app.action_history()
            await until(pilot, lambda: isinstance(app.screen, HistoryScreen))
            await pilot.pause()
            assert "no requests yet" in screen_text(app)
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is app.live_screen)
            future = app.start_generate(default_request(engine, prompt="after the note", steps=1))
            await finish(pilot, future, lambda: not app.generating)
    finally:
        app.shutdown()
    assert history_prompts(cache) == [("after the note", "done")]
