"""`plan` and `run` apply the same request defaults and the same checks: given the same flags, both
accept (exit 0, and `run` writes its file) or both refuse with the same one line (exit 2). CogVideoX's
transformer takes text of exactly its `max_text_seq_length` tokens, so the pipeline's default of 226
is refused by both, `plan` included, before anything is forecast."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import one_error_line

from omni_console.console.cli import main

SMALL = ["--frames", "9", "--height", "32", "--width", "32"]
REFUSED = [
    [],  # the pipeline's default text length, 226
    ["--guidance", "5"],  # a request flag, still the default text length
    ["--max-sequence-length", "17"],
    ["--max-sequence-length", "16", "--frames", "13"],  # a frame count CogVideoX renders otherwise
    ["--max-sequence-length", "16", "--height", "30", "--width", "32"],
    ["--max-sequence-length", "100000"],
]


def _run(capsys, model: Path, flags: list[str], out: Path) -> tuple[int, str]:
    code = main(["run", "--model", str(model), "--device", "cpu", "--steps", "1", "--output", str(out), *flags])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("flags", REFUSED, ids=lambda f: " ".join(f) or "defaults")
def test_plan_refuses_what_run_refuses_with_the_same_line(cogvideox_model_dir: Path, tmp_path: Path, capsys,
                                                          loads, flags):
    assert main(["plan", "--model", str(cogvideox_model_dir), "--device", "cpu", *flags]) == 2
    planned = one_error_line(capsys)
    out = tmp_path / "v.mp4"
    assert main(["run", "--model", str(cogvideox_model_dir), "--device", "cpu", "--steps", "1", "--output",
                 str(out), *flags]) == 2
    assert one_error_line(capsys) == planned
    assert not out.exists() and loads == []


@pytest.mark.slow
def test_plan_and_run_both_accept_the_text_length_the_transformer_takes(cogvideox_model_dir: Path, tmp_path: Path,
                                                                         capsys):
    flags = ["--max-sequence-length", "16", *SMALL]
    assert main(["plan", "--model", str(cogvideox_model_dir), "--device", "cpu", *flags]) == 0
    assert "CogVideoXPipeline" in capsys.readouterr().out
    out = tmp_path / "v.mp4"
    code, err = _run(capsys, cogvideox_model_dir, flags, out)
    assert code == 0, err
    assert out.is_file() and out.stat().st_size > 0


def test_plan_of_the_default_request_stays_torch_free(cogvideox_model_dir: Path, tmp_path: Path):
    """The default text length is checked from the installed source and the DiT's config: `plan` with
    no request flag refuses it without importing torch or diffusers."""
    code = ("import sys; from omni_console.console.cli import main; rc = main(['plan', '--model', sys.argv[1], "
            "'--device', 'cpu']); print(rc, 'torch' in sys.modules, 'diffusers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(cogvideox_model_dir)], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["2", "False", "False"], (done.stdout, done.stderr)
    assert "the pipeline's default 226 does not fit" in done.stderr
