"""`run` meets an out-of-memory error as the operator sees it: a stepped-down retry in the report, or, the
second time, one line, exit 1 and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from omni_console.console.cli import main
from omni_console.engine.engine import Engine
from omni_console.engine.model_dir.discovery import discover_model

FLAGS = ["--steps", "2", "--height", "64", "--width", "64", "--device", "cpu", "--json"]


@pytest.fixture
def oom_in_denoise(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """After every load, a streamed DiT block raises `torch.OutOfMemoryError` `times[0]` times from its 2nd call."""
    times = [1]
    load = Engine.load

    def load_then_fault(self, *args, **kwargs):
        report = load(self, *args, **kwargs)
        calls = []

        def fault(*_):
            calls.append(1)
            if len(calls) >= 2 and times[0] > 0:
                times[0] -= 1
                raise torch.OutOfMemoryError("injected: CUDA out of memory. Tried to allocate 2.00 GiB")

        self.pipe.transformer.single_transformer_blocks[1].register_forward_pre_hook(fault, prepend=True)
        return report

    monkeypatch.setattr(Engine, "load", load_then_fault)
    return times


@pytest.mark.slow
def test_one_oom_is_stepped_down_retried_and_reported(demo_model_dir: Path, tmp_path: Path, capsys,
                                                      oom_in_denoise, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))  # no profile: the budget keeps all 6
    out = tmp_path / "fox.png"
    budget = f"{discover_model(demo_model_dir).nbytes * 2}B"  # roomy: blocks resident, live re-plan on
    assert main(["run", "--model", str(demo_model_dir), "--output", str(out), "--vram-budget", budget,
                 *FLAGS]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    [step_down] = report["oom_step_downs"]
    assert step_down["phase"] == "denoise" and step_down["component"] == "transformer"
    assert "resident blocks 6→3" in step_down["action"]
    assert step_down["message"].startswith("injected: CUDA out of memory")
    assert "out of device memory in denoise (transformer)" in captured.err  # the progress line
    assert out.is_file() and report["process_peak_bytes"] is None and "cpu" in report["process_peak_note"]
    # no host copy of what the device holds (issue 35 no waste): every block and the VAE are resident, their
    # masters their files; the host holds what the plan names, and the host forecast pins that too
    named = report["forecast"]["pinned_host_bytes"]
    assert report["forecast"]["host_pinned_bytes"] == named
    assert named <= report["host_master_bytes"] <= named + 64 * 1024 < discover_model(demo_model_dir).nbytes // 10


@pytest.mark.slow
def test_a_second_oom_is_one_line_exit_1_and_nothing_written(demo_model_dir: Path, tmp_path: Path, capsys,
                                                             oom_in_denoise):
    oom_in_denoise[0] = 2
    out = tmp_path / "fox.png"
    assert main(["run", "--model", str(demo_model_dir), "--output", str(out), *FLAGS]) == 1
    captured = capsys.readouterr()
    [line] = [x for x in captured.err.splitlines() if x.startswith("omni-console:")]  # the rest is progress
    assert captured.err.splitlines()[-1] == line  # the failure is what an operator reads last, after the progress
    assert captured.out == "" and "Traceback" not in captured.err
    assert line.startswith("omni-console: generation failed: OutOfMemoryError: out of device memory again in "
                           "denoise (transformer) after stepping down")
    assert not out.exists() and not list(tmp_path.iterdir())
