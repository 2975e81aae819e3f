"""The request history in the console (palette: "Request history"): what `run` served, read back from the
cache by a later process, newest first; a corrupt history file is ignored with its one note."""

from __future__ import annotations

from pathlib import Path

import pytest
from app_helpers import make_app, screen_text, until

from omni_console.console.cli import main
from omni_console.console.screens import HistoryScreen
from omni_console.engine.service.history import History, HistoryEntry, HistoryRequest

SIZES = [(80, 24), (160, 48)]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(folder))
    return folder


def fixed_history(cache: Path) -> None:
    """Three requests with fixed figures: one done, one failed, one cancelled."""
    history = History(cache / "history.json")
    rows = [("done", "a red fox in the snow", 64, 64, {"mode": "dlo", "resident_layers": 1, "prefetch_slots": 2},
             0.25, 1_500_000_000, ["out/fox.png"], ""),
            ("failed", "a lighthouse at dusk", 1024, 1024, {"mode": "resident"}, None, None, [],
             "generation failed: OutOfMemoryError: CUDA out of memory"),
            ("cancelled", "a very long prompt " * 6, 512, 768, {"mode": "dlo", "resident_layers": 0,
                                                               "prefetch_slots": 3}, 1.5, 9_000_000_000, [], "")]
    for n, (status, prompt, w, h, policy, step, peak, files, error) in enumerate(rows, start=1):
        history.add(HistoryEntry(ticket=n, finished_at="2026-12-05T21:00:00+00:00", model="demo-flux",
                                 request=HistoryRequest(prompt=prompt, width=w, height=h, steps=2, output="out/x.png"),
                                 policy=policy, status=status, error=error, step_s=step, peak_bytes=peak,
                                 files=files))


async def open_history(pilot) -> None:
    await pilot.pause()
    pilot.app.action_history()
    await until(pilot, lambda: isinstance(pilot.app.screen, HistoryScreen))
    await pilot.pause()


@pytest.mark.slow
async def test_the_history_shows_what_run_served_in_an_earlier_process(demo_model_dir, engine, tmp_path, cache,
                                                                       capsys):
    out = tmp_path / "served.png"
    assert main(["run", "--model", str(demo_model_dir), "--output", str(out), "--prompt", "a blue teapot",
                 "--height", "64", "--width", "64", "--steps", "1"]) == 0
    capsys.readouterr()
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(200, 40)) as pilot:
        titles = {c.title: c for c in app.get_system_commands(app.screen)}
        titles["Request history"].callback()
        await until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        await pilot.pause()
        row = next((line for line in screen_text(app).splitlines() if "a blue teapot" in line), None)
        assert row is not None, screen_text(app)
        assert "done" in row and "64x64" in row and "dlo r0 k2" in row and str(out) in row
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HistoryScreen))
    app.shutdown()


@pytest.mark.slow
async def test_a_corrupt_history_shows_its_one_note_and_no_rows(engine, tmp_path, cache):
    cache.mkdir()
    (cache / "history.json").write_bytes(b"\x00not json")
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(160, 30)) as pilot:
        await open_history(pilot)
        text = screen_text(app)
        assert f"history {cache / 'history.json'} ignored: is not a valid history file" in text
        assert "no requests yet" in text
    app.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_history_screen_snapshot(snap_compare, engine, tmp_path, cache, size):
    fixed_history(cache)
    app = make_app(engine, tmp_path, theme="omni-dark")
    try:
        assert snap_compare(app, terminal_size=size, run_before=open_history)
    finally:
        app.shutdown()
