"""`run` into a pipe with TERM=dumb prints plain text: no escape sequence (no colour, no terminal query, no
image protocol), previews or not; and `--preview auto` there asks the terminal nothing."""

from __future__ import annotations

import os
import subprocess
import sys

from omni_console.console.preview_mode import HALFBLOCK, resolve_preview


def test_run_into_a_pipe_with_term_dumb_prints_no_escape_sequences(demo_model_dir, tmp_path):
    env = {**os.environ, "TERM": "dumb"}
    env.pop("TMUX", None)
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from omni_console.console.cli import main; sys.exit(main())",
         "run", "--model", str(demo_model_dir), "--device", "cpu", "--steps", "2", "--output",
         str(tmp_path / "out.png")],
        stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert (tmp_path / "out.png").is_file()
    for stream in (done.stdout, done.stderr):
        assert b"\x1b" not in stream and b"\x9b" not in stream, stream.decode(errors="replace")


def test_auto_in_a_pipe_with_term_dumb_asks_nothing():
    def detect() -> str:
        raise AssertionError("the terminal was queried")

    class Pipe:
        def isatty(self) -> bool:
            return False

    assert resolve_preview("auto", {"TERM": "dumb"}, Pipe(), detect) == HALFBLOCK
