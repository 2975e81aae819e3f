"""Nothing from data reaches the terminal as a control sequence or as markup.

A model directory whose path, component name and stray files carry `ESC ]52;c;…` (clipboard write),
`ESC ]2;…` (window title), BEL, a C1 CSI byte and rich/Textual markup (`[/x]`, `[bold red]`,
`[@click=…]`) is shown through `plan` (a pseudo-terminal and a pipe), stderr lines, `run`'s progress
and report, and the console's component table: every such character appears escaped (`\\x1b`),
every bracket as typed, and no ESC, BEL or C1 byte from the data is written.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from app_helpers import make_app, screen_text, until

from omni_console.console.cli import main
from omni_console.console.event_text import loading_line, progress_line
from omni_console.engine.engine import Engine
from omni_console.engine.events import LoadProgress
from omni_console.offload.events import ErrorEvent

OSC_TITLE = "\x1b]2;PWNED\x07"
OSC_CLIP = "\x1b]52;c;cHduZWQ=\x07"
C1_CSI = "\u009b31m"
DIR_NAME = f"m [/x] [bold red]R{OSC_TITLE}"
COMPONENT = f"vae_[@click=app.quit]X{OSC_TITLE}"
STRAY = f"t{OSC_CLIP}{C1_CSI}.bin"
SGR = re.compile(r"\x1b\[[0-9;]*m")  # the colours rich itself writes on a terminal


def assert_no_data_controls(text: str) -> None:
    """No ESC (beyond rich's own SGR colour codes), BEL or C1 character; the payloads only escaped."""
    rest = SGR.sub("", text)
    bad = sorted({f"{ord(c):#x}" for c in rest if c == "\x1b" or c == "\x07" or 0x80 <= ord(c) < 0xA0})
    assert not bad, bad
    assert "]52;c;" not in rest.replace("\\x1b]52;c;", "")


@pytest.fixture(scope="module")
def hostile_model(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile") / DIR_NAME
    shutil.copytree(demo_model_dir, root)
    (root / f"{OSC_CLIP}.py").write_text("")
    (root / "vae" / STRAY).write_bytes(b"not read")
    shutil.copytree(demo_model_dir / "vae", root / COMPONENT)
    index = json.loads((root / "model_index.json").read_text())
    index[COMPONENT] = ["diffusers", "AutoencoderKL"]
    (root / "model_index.json").write_text(json.dumps(index))
    return root


def _escaped(s: str) -> str:
    return s.encode("unicode_escape").decode().replace("\\u009b", "\\x9b")


def run_in_pty(argv: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, str]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 200, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                proc.kill()
                pytest.fail("no output from the pseudo-terminal in time")
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: the child closed its side
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
    return proc.wait(timeout=timeout), out.decode("utf-8", "replace")


def test_plan_on_a_terminal_shows_names_escaped(hostile_model: Path):
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "200"}
    env.pop("NO_COLOR", None)
    code, out = run_in_pty([sys.executable, "-m", "omni_console.console.cli", "plan", "--model", str(hostile_model),
                            "--device", "cpu"], env)
    assert code == 0, out
    assert SGR.search(out), "rich wrote no colour: the output did not go to a terminal"
    assert_no_data_controls(out)
    shown = SGR.sub("", out)
    assert _escaped(COMPONENT) in shown and "[/x] [bold red]R" in shown
    assert f"vae/{_escaped(STRAY)}" in shown


def test_plan_piped_shows_names_escaped(hostile_model: Path, capsys):
    assert main(["plan", "--model", str(hostile_model), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert_no_data_controls(out)
    assert "\x1b" not in out
    rows = [line.split("\t") for line in out.splitlines()]
    assert any(row[0] == _escaped(COMPONENT) for row in rows)
    assert f"note: ignored {_escaped(OSC_CLIP)}.py: code in a model directory is never run" in out.splitlines()


def test_an_error_line_on_stderr_is_escaped(tmp_path: Path, capsys):
    missing = tmp_path / f"gone [/x]{OSC_CLIP}"
    assert main(["plan", "--model", str(missing)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("omni-console: error: ")
    assert_no_data_controls(err)
    assert _escaped(OSC_CLIP) in err


def test_event_lines_escape_names_and_messages():
    load = LoadProgress(component=COMPONENT, phase="host", done_bytes=5, total_bytes=5)
    error = ErrorEvent(where="generation", message=f"boom {OSC_CLIP} [/x]\nsecond line")
    for line in (progress_line(load)[0], progress_line(error)[0], loading_line(load, 0.0), loading_line(error, 0.0)):
        assert_no_data_controls(line)
    assert _escaped(COMPONENT) in progress_line(load)[0]


def test_run_progress_and_report_show_paths_as_text(demo_model_dir: Path, tmp_path: Path, capfd):
    model = tmp_path / DIR_NAME
    shutil.copytree(demo_model_dir, model)
    (model / "vae" / STRAY).write_bytes(b"not read")
    out = tmp_path / f"o [/x] [bold red]{OSC_TITLE}.png"
    assert main(["run", "--headless", "--model", str(model), "--output", str(out), "--steps", "2"]) == 0
    assert out.is_file()
    captured = capfd.readouterr()
    assert_no_data_controls(captured.out)
    assert_no_data_controls(captured.err)
    assert "load transformer" in captured.err  # the progress lines were written
    assert f"wrote {_escaped(str(out))}" in captured.out


async def test_console_component_table_shows_names_as_text(hostile_model: Path, tmp_path: Path):
    engine = Engine(hostile_model, device="cpu")
    app = make_app(engine, tmp_path)
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            await until(pilot, lambda: app.plan_screen.table.row_count > 0)
            table = app.plan_screen.table
            assert str(table.get_cell(COMPONENT, "name")) == _escaped(COMPONENT)
            text = screen_text(app)
            assert_no_data_controls(text)
            assert "vae_[@click=app.quit]X" in text
            app.say(f"saved {hostile_model}")
            await pilot.pause()
            assert_no_data_controls(screen_text(app))
    finally:
        app.shutdown()
        engine.close()
