"""The real `omni-console` on a pseudo-terminal, engine idle: q ends the process with status 0 and gives the
terminal back as it was — alternate screen left, mouse reporting off, cooked mode — although the process
ends without finalizing the interpreter and Textual's key thread is not joined. (How fast: benchmarks/startup.py.)"""

from __future__ import annotations

import os

import pytest

exit_process = pytest.importorskip("test_app_exit_process")

IDLE_SCRIPT = r"""
import os, sys
from pathlib import Path
from omni_console.console.app import OmniConsoleApp
from omni_console.console.cli import main

ready, model = Path(sys.argv[1]), sys.argv[2]
real_mount = OmniConsoleApp.on_mount

def on_mount(self):
    real_mount(self)
    self.call_after_refresh(lambda: ready.write_text(str(os.getpid())))

OmniConsoleApp.on_mount = on_mount
sys.exit(main(["--model", model, "--telemetry-hz", "10"]))
"""
MOUSE_ON, MOUSE_OFF = b"\x1b[?1000h", b"\x1b[?1000l"


@pytest.mark.slow
def test_q_on_an_idle_console_exits_0_and_restores_the_terminal(tmp_path, demo_model_dir, monkeypatch):
    monkeypatch.setattr(exit_process, "SCRIPT", IDLE_SCRIPT)
    term = exit_process.Terminal(tmp_path, demo_model_dir)
    try:
        term.wait_ready()
        os.write(term.master, b"q")
        code, _ = term.wait_exit(exit_process.EXIT_LIMIT_S)
        assert code == 0, bytes(term.output)[-2000:]
        assert term.restored()
        out = bytes(term.output)
        assert out.rfind(MOUSE_ON) >= 0 and out.rfind(MOUSE_OFF) > out.rfind(MOUSE_ON)
        assert b"Traceback" not in out
    finally:
        term.close()
