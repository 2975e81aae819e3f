"""The history file is cache input anyone with the cache's folder may have written: every string the history
screen shows from it (prompt, policy, output, error, the file's note) reaches the terminal without controls
and is never read as markup."""

from __future__ import annotations

from pathlib import Path

import pytest
from app_helpers import make_app, screen_text, until
from test_hostile_screens import assert_clean

from omni_console.console.screens import HistoryScreen
from omni_console.engine.service.history import History, HistoryEntry, HistoryRequest

EVIL = "\x1b]0;pwned\x07\u202e[bold red]x[/]"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / f"cache{EVIL.replace('/', '')}"
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(folder))
    return folder


def hostile_history(cache: Path) -> None:
    history = History(cache / "history.json")
    policies = [{"mode": EVIL}, {"mode": "dlo", "resident_layers": EVIL, "prefetch_slots": [EVIL]}]
    for ticket, policy in enumerate(policies, start=1):
        history.add(HistoryEntry(ticket=ticket, finished_at="2026-12-05T21:00:00+00:00", model=EVIL,
                                 request=HistoryRequest(prompt=EVIL, width=64, height=64, steps=1, output=EVIL),
                                 policy=policy, status="failed" if ticket == 1 else "done", error=EVIL,
                                 files=[] if ticket == 1 else [EVIL]))


@pytest.mark.slow
async def test_a_hostile_history_is_shown_escaped(engine, tmp_path, cache):
    hostile_history(cache)
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(240, 30)) as pilot:
        await pilot.pause()
        app.action_history()
        await until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        await pilot.pause()
        text = screen_text(app)
        assert_clean(text, "history screen")
        assert "\\x1b]0;pwned" in text and "[bold red]x[/]" in text  # shown, escaped, not read as markup
    app.shutdown()


@pytest.mark.slow
async def test_the_history_files_note_is_shown_escaped(engine, tmp_path, cache):
    cache.mkdir()
    (cache / "history.json").write_bytes(b"\x00not json")
    app = make_app(engine, tmp_path)
    async with app.run_test(size=(240, 30)) as pilot:
        await pilot.pause()
        app.action_history()
        await until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        await pilot.pause()
        text = screen_text(app)
        assert_clean(text, "history note")
        assert "ignored: is not a valid history file" in text
    app.shutdown()
