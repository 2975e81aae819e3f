"""Every screen, walked with a model path made of terminal controls, shows none of them raw.

The demo model is copied to a directory whose name holds ESC (with an OSC 52 clipboard write and a
title change), U+202E (reverses what follows), BEL, CR, every other C0 control, DEL and every C1
control; the output directory and the prompt carry them too. The plan screen, the budget dialog,
help, the `c` copy screen, the load, the live screen, the generate dialog, a finished request, the
notice log and `plan`/`run` on the command line are each rendered, and no control or bidi format
character may reach what the terminal is given. (The OSC 52 payload itself is base64: never raw.)
"""

from __future__ import annotations

import shutil
import unicodedata
from pathlib import Path

import pytest
from app_helpers import finish, load, make_app, screen_text, until

from omni_console.console.cli import main
from omni_console.console.screens import (
    CopyCommandScreen,
    GenerateDialog,
    HelpScreen,
    LiveScreen,
    NoticeLogScreen,
    PlanScreen,
)
from omni_console.console.screens.budget import BudgetDialog
from omni_console.engine.engine import Engine

C0 = "".join(chr(c) for c in range(1, 0x20) if chr(c) not in "\n")  # no NUL (no path holds one); \n below
C1 = "".join(chr(c) for c in range(0x80, 0xA0))
HOSTILE = f"m\x1b]52;c;cHduZWQ=\x07\x1b]2;PWNED\x07\u202eevil\r{C0}\x7f{C1}\n\u2066z"
"""Not a legal path on every OS, but a legal one here: everything but NUL and '/'."""

def controls_in(text: str) -> list[str]:
    """Control (Cc) and format (Cf: bidi, zero-width) characters in `text`, line breaks aside."""
    return sorted({f"{ord(c):#x}" for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf")})

def assert_clean(text: str, where: str) -> None:
    assert not controls_in(text), f"{where}: {controls_in(text)}"

@pytest.fixture(scope="module")
def hostile_dir(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile") / HOSTILE
    shutil.copytree(demo_model_dir, root)
    return root

@pytest.mark.slow
async def test_every_screen_shows_a_hostile_model_path_without_controls(hostile_dir: Path, tmp_path: Path):
    engine = Engine(hostile_dir, device="cpu")
    app = make_app(engine, tmp_path, prompt=f"p{HOSTILE}")
    app.out_dir = tmp_path / f"out{HOSTILE}"
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.plan_screen.table.row_count > 0)
            assert_clean(screen_text(app), "plan screen")
            assert "\\x1b" in screen_text(app)  # the path is shown, escaped (the sub-title)

            await pilot.press("b")
            await until(pilot, lambda: isinstance(app.screen, BudgetDialog))
            assert_clean(screen_text(app), "budget dialog")
            await pilot.press("escape")

            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen))
            assert_clean(screen_text(app), "help")
            await pilot.press("escape")

            await until(pilot, lambda: isinstance(app.screen, PlanScreen))
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, CopyCommandScreen))
            shown = screen_text(app)
            assert_clean(shown, "copy command")
            assert "$'" in shown  # the path as a shell word that means the same path when pasted
            assert str(hostile_dir) in app.clipboard  # the command itself: OSC 52 sends it base64
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, PlanScreen))

            await load(pilot, app)
            assert isinstance(app.screen, LiveScreen)
            assert_clean(screen_text(app), "live screen")
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, CopyCommandScreen))
            assert_clean(screen_text(app), "copy command (live)")
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, LiveScreen))

            await pilot.press("g")
            await until(pilot, lambda: isinstance(app.screen, GenerateDialog))
            assert_clean(screen_text(app), "generate dialog")
            app.screen.query_one("#steps").value = "1"
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, LiveScreen))
            await finish(pilot, app.last_command["generate"], lambda: not app.generating)
            await pilot.pause()
            assert app.last_output is not None and app.last_output.is_file()
            assert_clean(screen_text(app), "live screen after a request")

            await pilot.press("n")
            await until(pilot, lambda: isinstance(app.screen, NoticeLogScreen))
            assert_clean(screen_text(app), "notice log")
            assert any(str(app.out_dir)[:3] in text for text, _ in app.notices)
            for text, _severity in app.notices:
                assert_clean(text, "a kept notice")
    finally:
        app.shutdown()
        engine.close()

@pytest.mark.slow
def test_plan_and_run_lines_show_a_hostile_model_path_without_controls(hostile_dir: Path, tmp_path: Path, capfd):
    assert main(["plan", "--model", str(hostile_dir), "--device", "cpu"]) == 0
    out, err = capfd.readouterr()
    assert_clean(out.replace("\t", ""), "plan's output")
    assert_clean(err, "plan's stderr")
    output = tmp_path / f"o{HOSTILE}.png"
    assert main(["run", "--headless", "--model", str(hostile_dir), "--output", str(output), "--steps", "1"]) == 0
    assert output.is_file()
    out, err = capfd.readouterr()
    assert_clean(out, "run's report")
    assert_clean(err, "run's progress")
