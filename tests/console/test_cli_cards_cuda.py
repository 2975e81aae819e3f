"""On a GPU: `run --vram-budget` keeps the process's device memory (NVML, per process) inside the budget,
reports it beside the forecast's figure, and the next plan counts the context it measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from omni_console.console.cli import main
from omni_console.engine.planning import device_footprint as fp

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
GB = 10**9


def test_a_budget_run_stays_inside_it_and_the_next_plan_counts_the_measured_context(
        demo_model_dir: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))  # no footprint measured yet
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)  # what `run` sets is undone afterwards
    flags = ["--model", str(demo_model_dir), "--device", "cuda", "--height", "64", "--width", "64",
             "--vram-budget", "3GB", "--json"]
    assert main(["plan", *flags]) == 0
    plan = json.loads(capsys.readouterr().out)["request_forecast"]
    assert plan["context_source"] == "default" and plan["context_bytes"] == fp.DEFAULT_CONTEXT_BYTES
    assert main(["run", *flags, "--steps", "2", "--output", str(tmp_path / "fox.png")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["allocator_cap_bytes"] is not None and report["allocator_cap_bytes"] <= 3 * GB
    assert report["oom_step_downs"] == []
    if report["process_peak_bytes"] is None:  # a PID namespace hides this process from NVML
        assert "not in NVML's list" in report["process_peak_note"]
        return
    assert report["process_peak_bytes"] <= 3 * GB
    assert report["predicted_process_peak_bytes"] is None or report["process_peak_error"] is not None
    assert report["context_bytes"] and report["context_bytes"] > 0
    assert main(["plan", *flags]) == 0
    again = json.loads(capsys.readouterr().out)["request_forecast"]
    assert again["context_source"] == "measured" and again["context_bytes"] == report["context_bytes"]
