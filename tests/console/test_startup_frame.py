"""The console's first frame: on a terminal at once (before torch and Textual), ticked as parts load, and
the terminal always given back (an error or Ctrl+C before the app ran: main screen, cursor, echo)."""

from __future__ import annotations

import io
import os

import pytest
from pty_cli import Pty

from omni_console.console.startup_frame import ENTER, LEAVE, StartupFrame

ALT_ON, ALT_OFF = b"\x1b[?1049h", b"\x1b[?1049l"


def test_the_frame_names_the_model_and_ticks_each_step():
    frame = StartupFrame("/models/flux\x1b]52;c;x\x07")  # not a terminal: nothing drawn, the text still kept
    assert not frame.active
    frame.step("checking the flags")
    frame.step("importing torch")
    rows = frame.lines(80, 24)
    assert len(rows) == 24 and all(len(row) <= 80 for row in rows)
    assert rows[0].startswith(" omni-console — /models/flux\\x1b]52;c;x\\x07")  # data escaped, never sent raw
    assert rows[3].startswith("   ✓ checking the flags (") and rows[3].endswith(" s)")
    assert rows[4] == "   … importing torch"
    assert rows[-1].strip() == "ctrl+c quit"


def test_nothing_is_written_when_stdout_is_not_a_terminal():
    out = io.StringIO()
    frame = StartupFrame("/m", out)
    frame.open()
    frame.step("importing torch")
    frame.close()
    assert out.getvalue() == ""


def test_a_bad_flag_after_the_frame_gives_the_terminal_back_and_says_one_line():
    term = Pty("--theme", "nope")
    code, out, echo = term.finish()
    assert code == 2 and echo
    assert out.index(ENTER.encode()) < out.rindex(LEAVE.encode())  # the frame was shown, then left
    after = out[out.rindex(LEAVE.encode()) + len(LEAVE):].decode()
    assert [ln for ln in after.splitlines() if ln.strip()] == [
        "omni-console: error: unknown theme 'nope'; valid themes: omni-dark, omni-high-contrast, omni-light"]


@pytest.mark.slow
def test_ctrl_c_while_starting_gives_the_terminal_back(demo_model_dir):
    term = Pty("--model", str(demo_model_dir))
    term.wait_for(b"importing torch")
    os.write(term.master, b"\x03")
    code, out, echo = term.finish()
    assert code == 130 and echo
    assert out.rfind(ALT_OFF) > out.rfind(ALT_ON)
    assert out[out.rfind(ALT_OFF):].decode().strip().endswith("omni-console: interrupted (SIGINT); nothing written")


@pytest.mark.slow
def test_the_first_frame_comes_before_torch_and_the_app_draws_over_it(demo_model_dir):
    term = Pty("--model", str(demo_model_dir))
    first = term.wait_for(b"starting the console:")
    before_app = bytes(term.out)
    term.wait_for(b" load")  # the app's footer (`l load`): Textual has drawn the plan screen
    os.write(term.master, b"q")
    code, out, echo = term.finish()
    assert code == 0 and echo
    assert b"torch" in out and b"reading the model" in out
    assert ALT_OFF not in before_app  # the frame and the app share one alternate screen: no flash of the shell
    assert out.count(ALT_OFF) >= 1 and out.rfind(ALT_OFF) > out.rfind(ALT_ON)
    print(f"first frame after {first:.2f} s")
