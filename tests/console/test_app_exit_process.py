"""The real `omni-console` process on a pseudo-terminal, with the engine stuck in a step that ignores cancel:
q, SIGTERM and SIGHUP each leave the alternate screen, give the terminal back in cooked mode and end the
process within a few seconds (exit 0 after q, 128 + signal number after a signal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

termios = pytest.importorskip("termios")
fcntl = pytest.importorskip("fcntl")
import struct  # noqa: E402

pytestmark = pytest.mark.slow  # end to end (the real process on a pseudo-terminal): .ci/run runs it, pytest -q skips it

EXIT_LIMIT_S = 3.0
"""The app itself exits within 2 s of the quit; the rest is process teardown on a busy 2-core machine."""
ALT_SCREEN_ON, ALT_SCREEN_OFF = b"\x1b[?1049h", b"\x1b[?1049l"

# The console as the CLI runs it; once mounted, the engine thread enters a "kernel" that ignores cancel
# for two minutes, then the ready file is written. Mode "cuda": the engine first loads the model on the
# GPU (pinned host arena, streamed blocks), then runs long matrix products back to back.
SCRIPT = r"""
import os, sys, threading, time
from pathlib import Path
from omni_console.console.app import OmniConsoleApp
from omni_console.console.cli import main

ready, model, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
real_mount = OmniConsoleApp.on_mount

def on_mount(self):
    real_mount(self)
    entered = threading.Event()

    def stuck_kernel(engine):
        if mode == "cuda":
            import torch
            engine.load(self.policy)
            a = torch.randn(32768, 32768, device="cuda", dtype=torch.bfloat16)
            torch.cuda.synchronize()
            entered.set()
            end = time.monotonic() + 120
            while time.monotonic() < end:
                a @ a
                torch.cuda.synchronize()
        entered.set()
        threading.Event().wait(120)

    self.worker.call(stuck_kernel)
    assert entered.wait(120)
    self.call_after_refresh(lambda: ready.write_text(str(os.getpid())))

OmniConsoleApp.on_mount = on_mount
sys.exit(main(["--model", model, "--telemetry-hz", "2"]))
"""


class Terminal:
    """A pseudo-terminal running the console; collects everything the app writes to it."""

    def __init__(self, tmp_path: Path, model: Path, mode: str = "wait") -> None:
        self.ready = tmp_path / "ready"
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
        self.cooked = termios.tcgetattr(self.slave)
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "140", "LINES": "40"}
        self.proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(self.ready), str(model), mode],
                                     stdin=self.slave, stdout=self.slave, stderr=self.slave, env=env,
                                     cwd=tmp_path, start_new_session=True)
        self.output = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: every writer has gone
                return
            if not data:
                return
            self.output += data

    def wait_ready(self, limit_s: float = 120.0) -> None:
        deadline = time.monotonic() + limit_s
        while not self.ready.exists():
            if self.proc.poll() is not None:
                tail = bytes(self.output)[-2000:]
                raise AssertionError(f"the console ended early ({self.proc.returncode}): {tail!r}")
            assert time.monotonic() < deadline, "the console did not start"
            time.sleep(0.05)
        assert ALT_SCREEN_ON in self.output

    def wait_exit(self, limit_s: float) -> tuple[int, float]:
        start = time.monotonic()
        try:
            code = self.proc.wait(timeout=limit_s + 30)  # measured below, with room to report how long
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return code, time.monotonic() - start

    def restored(self) -> bool:
        """The alternate screen was left after it was last entered, and the tty is in cooked mode again."""
        out = bytes(self.output)
        lflag = termios.tcgetattr(self.slave)[3]
        return (out.rfind(ALT_SCREEN_OFF) > out.rfind(ALT_SCREEN_ON)
                and lflag & (termios.ICANON | termios.ECHO) == self.cooked[3] & (termios.ICANON | termios.ECHO))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.slave)
        self.reader.join(5)
        os.close(self.master)


@pytest.fixture
def terminal(tmp_path, demo_model_dir):
    term = Terminal(tmp_path, demo_model_dir)
    yield term
    term.close()


def test_q_while_the_engine_is_stuck_exits_within_seconds_and_restores_the_terminal(terminal):
    terminal.wait_ready()
    start = time.monotonic()
    os.write(terminal.master, b"q")
    code, _ = terminal.wait_exit(EXIT_LIMIT_S)
    elapsed = time.monotonic() - start
    assert code == 0
    assert elapsed < EXIT_LIMIT_S, f"exit took {elapsed:.2f} s after q"
    assert terminal.restored()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_quit_like_q_and_restore_the_terminal(terminal, signum):
    terminal.wait_ready()
    start = time.monotonic()
    terminal.proc.send_signal(signum)
    code, _ = terminal.wait_exit(EXIT_LIMIT_S)
    elapsed = time.monotonic() - start
    assert code == 128 + signum, f"exit status {code}"
    assert elapsed < EXIT_LIMIT_S, f"exit took {elapsed:.2f} s after the signal"
    assert terminal.restored()


@pytest.mark.cuda
def test_q_while_cuda_kernels_run_on_a_loaded_model_exits_within_seconds(tmp_path, demo_model_dir):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    term = Terminal(tmp_path, demo_model_dir, mode="cuda")
    try:
        term.wait_ready(limit_s=300)
        start = time.monotonic()
        os.write(term.master, b"q")
        code, _ = term.wait_exit(EXIT_LIMIT_S)
        elapsed = time.monotonic() - start
        print(f"exit {elapsed:.2f} s after q with CUDA kernels in flight")
        assert code == 0
        assert elapsed < EXIT_LIMIT_S, f"exit took {elapsed:.2f} s after q"
        assert term.restored()
    finally:
        term.close()
