"""One rule for every signal at every moment: one line, 130/143/129, and nothing or everything left.

Every case is the real CLI in a subprocess (a pseudo-terminal for the console), stopped at a named moment
through `OMNI_CONSOLE_TEST_PAUSE` (`engine/running/signal_guard.pause_point`) and then sent the signal.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from pty_cli import Pty, controlling_terminal

SIGNALS = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
IDS = ["INT", "TERM", "HUP"]
WAN_FAST = ["--height", "32", "--width", "32", "--steps", "2", "--max-sequence-length", "32"]
DEMO_FAST = ["--height", "64", "--width", "64", "--steps", "1"]


def nothing_line(signum: int) -> str:
    return f"omni-console: interrupted ({signal.Signals(signum).name}); nothing written\n"


def spawn(args: list[str], cwd: Path, moment: str | None = None) -> tuple[subprocess.Popen, Path]:
    flag = cwd / f".pause-{moment}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if moment is not None:
        env["OMNI_CONSOLE_TEST_PAUSE"] = f"{moment}={flag}"
    proc = subprocess.Popen([sys.executable, "-m", "omni_console.console.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, flag


def wait_paused(proc: subprocess.Popen, flag: Path, limit_s: float = 240) -> None:
    deadline = time.monotonic() + limit_s
    while not flag.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "never reached the pause"
        time.sleep(0.01)


def finish(proc: subprocess.Popen, flag: Path | None = None) -> tuple[int, str, str]:
    if flag is not None:  # a handler that does not end the process (Ctrl+C's cancel) lets the pause return
        time.sleep(0.3)
        flag.unlink(missing_ok=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, out, err


def user_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".pause-"))


@pytest.mark.slow
@pytest.mark.parametrize("signum", list(SIGNALS), ids=IDS)
@pytest.mark.parametrize("command", ["plan", "demo-model", "run"])
def test_a_signal_during_the_imports_is_one_line(tmp_path, demo_model_dir, command, signum):
    args = {"plan": ["plan", "--model", str(demo_model_dir)], "demo-model": ["demo-model", "demo"],
            "run": ["run", "--model", str(demo_model_dir), "--output", "o.png", *DEMO_FAST]}[command]
    proc, flag = spawn(args, tmp_path, "imports")
    wait_paused(proc, flag)
    proc.send_signal(signum)
    code, out, err = finish(proc, flag)
    assert (code, out, err) == (SIGNALS[signum], "", nothing_line(signum))
    assert user_files(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("signum", list(SIGNALS), ids=IDS)
def test_a_signal_during_the_torch_import_is_one_line_never_an_abort(tmp_path, demo_model_dir, signum):
    proc, flag = spawn(["run", "--model", str(demo_model_dir), "--output", "o.png", *DEMO_FAST], tmp_path, "imports")
    wait_paused(proc, flag)
    flag.unlink()  # go on into `import torch` (seconds on this machine) ...
    time.sleep(0.15)
    proc.send_signal(signum)  # ... and stop it there
    code, out, err = finish(proc)
    assert (code, out, err) == (SIGNALS[signum], "", nothing_line(signum))
    assert user_files(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("signum", list(SIGNALS), ids=IDS)
def test_a_signal_between_a_sequences_frames_leaves_none_of_them(tmp_path, wan_model_dir, signum):
    proc, flag = spawn(["run", "--model", str(wan_model_dir), "--output", "s.png", "--frames", "5", *WAN_FAST],
                       tmp_path, "between-frames")
    wait_paused(proc, flag)
    proc.send_signal(signum)
    code, out, err = finish(proc, flag)
    assert (code, out) == (SIGNALS[signum], "") and err.endswith(nothing_line(signum)), err
    assert err.count("interrupted") == 1 and "Traceback" not in err
    assert user_files(tmp_path) == []  # no frame, no manifest, no scratch folder


@pytest.mark.slow
@pytest.mark.parametrize("signum", list(SIGNALS), ids=IDS)
def test_a_signal_just_after_the_write_keeps_the_complete_output_and_says_so(tmp_path, demo_model_dir, signum):
    proc, flag = spawn(["run", "--model", str(demo_model_dir), "--output", "o.png", *DEMO_FAST], tmp_path,
                       "after-write")
    wait_paused(proc, flag)
    proc.send_signal(signum)
    code, out, err = finish(proc, flag)
    name = signal.Signals(signum).name
    assert (code, out) == (SIGNALS[signum], "") and "Traceback" not in err
    assert err.endswith(f"omni-console: interrupted ({name}); output complete: o.png\n"), err  # as --output named it
    assert err.count("interrupted") == 1
    assert user_files(tmp_path) == ["o.png"] and Image.open(tmp_path / "o.png").size == (64, 64)


@pytest.mark.slow
def test_the_console_without_a_terminal_is_refused_and_exits(tmp_path, demo_model_dir):
    done = subprocess.run([sys.executable, "-m", "omni_console.console.cli", "--model", str(demo_model_dir)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == ["omni-console: error: the console needs a terminal (stdin is not one); for "
                                        "scripts use `omni-console run` or `omni-console plan`"]


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["starting", "running"])
def test_a_terminal_hangup_ends_the_console_with_129(tmp_path, demo_model_dir, moment):
    master, slave = os.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"}
    proc = subprocess.Popen([sys.executable, "-m", "omni_console.console.cli", "--model", str(demo_model_dir)],
                            stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
                            preexec_fn=controlling_terminal, cwd=tmp_path)
    os.close(slave)
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            seen.extend(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    want = b"starting the console:" if moment == "starting" else b" load"
    deadline = time.monotonic() + 240
    while want not in seen:
        assert proc.poll() is None and time.monotonic() < deadline, bytes(seen)[-600:]
        time.sleep(0.01)
    os.close(master)  # the terminal goes away: the kernel sends SIGHUP to its session
    try:
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert code == 129


@pytest.mark.slow
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(signum=st.sampled_from(list(SIGNALS)), delay=st.floats(0.0, 12.0))
def test_a_signal_at_a_random_moment_of_a_run(tmp_path_factory, demo_model_dir, signum, delay):
    """From the first line of `main` on (before it, the interpreter's own start-up runs no code of ours)."""
    folder = tmp_path_factory.mktemp("random")
    proc, flag = spawn(["run", "--model", str(demo_model_dir), "--output", "o.png", *DEMO_FAST], folder, "imports")
    wait_paused(proc, flag)
    flag.unlink()
    time.sleep(delay)
    if proc.poll() is None:
        proc.send_signal(signum)
    started = time.monotonic()
    code, out, err = finish(proc)
    assert time.monotonic() - started < 60 and "Traceback" not in err
    assert code in {0, *SIGNALS.values()}, err
    complete = user_files(folder) == ["o.png"] and Image.open(folder / "o.png").size == (64, 64)
    if code == 0:
        assert complete and "interrupted" not in err
        return
    assert code == SIGNALS[signum] and err.count("interrupted") == 1
    last = err.splitlines()[-1]
    if last.endswith("nothing written"):
        assert last == nothing_line(signum).strip() and user_files(folder) == []
    else:
        assert last.endswith("output complete: o.png") and complete


class Console(Pty):
    """The console on a pseudo-terminal of 80x24 (stderr there too, as in a shell)."""

    def __init__(self, model: Path, cwd: Path) -> None:
        super().__init__("--model", str(model), cwd=cwd)

    def wait_for(self, text: bytes, limit_s: float = 240) -> float:
        return super().wait_for(text, limit_s)

    def finish(self, timeout_s: float = 60) -> tuple[int, str, bool]:
        """(exit status, what was printed after the alternate screen was left, whether keys echo again)."""
        code, out, echo = super().finish(timeout_s)
        after = out[out.rfind(b"\x1b[?1049l") + 8:].decode(errors="replace")
        return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", after), echo  # Textual's last modes (cursor, focus)


@pytest.mark.slow
@pytest.mark.parametrize("signum", list(SIGNALS), ids=IDS)
@pytest.mark.parametrize("moment", ["starting", "running"])
def test_a_signal_to_the_console_gives_the_terminal_back_and_one_line(tmp_path, demo_model_dir, moment, signum):
    term = Console(demo_model_dir, tmp_path)
    term.wait_for(b"importing torch" if moment == "starting" else b" load")
    term.proc.send_signal(signum)
    code, after, echo = term.finish()
    name = signal.Signals(signum).name
    outcome = ("nothing written" if moment == "starting"
               else "every saved output is complete, nothing half-written is left")
    assert code == SIGNALS[signum] and echo
    assert [ln.strip() for ln in after.splitlines() if ln.strip()] == [f"omni-console: interrupted ({name}); {outcome}"]


@pytest.mark.slow
def test_a_signal_during_an_overwrite_of_a_sequence_leaves_the_old_frames_as_they_were(tmp_path, wan_model_dir):
    args = ["run", "--model", str(wan_model_dir), "--output", "s.png", "--frames", "5", *WAN_FAST]
    proc, _ = spawn(args, tmp_path)
    assert finish(proc)[0] == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert len([n for n in before if n.startswith("s-")]) == 5 and ".s.png.omni-frames.json" in before
    proc, flag = spawn([*args[:-len(WAN_FAST)], "--seed", "1", *WAN_FAST, "--overwrite"], tmp_path, "between-frames")
    wait_paused(proc, flag)
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc, flag)
    assert (code, out) == (143, "") and err.endswith(nothing_line(signal.SIGTERM))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if not p.name.startswith(".pause-")} == before
