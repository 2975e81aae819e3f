"""`--compile` in `plan` and `run`: what the plan says it expects, what the run report and `--json` carry, and a
bad value as one line and exit 2 before anything loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import one_error_line

from omni_console.console.cli import main
from omni_console.engine.planning.compile_choice import WARM_SHARE


def test_plan_on_cpu_says_auto_is_off_and_why(demo_model_dir: Path, capsys):
    assert main(["plan", "--model", str(demo_model_dir), "--device", "cpu", "--compile", "auto", "--json"]) == 0
    compiled = json.loads(capsys.readouterr().out)["compile"]
    assert compiled["asked"] == "auto" and compiled["on"] is False
    assert compiled["why"].startswith("no CUDA device")


def test_plan_regional_names_the_cold_start_workspace_and_exactness(demo_model_dir: Path, capsys):
    assert main(["plan", "--model", str(demo_model_dir), "--device", "cpu", "--compile", "regional"]) == 0
    out = capsys.readouterr().out
    assert "compile regional: regional, cold start" in out and "(estimated) in the first step" in out
    assert "compile workspace" in out
    assert "compiled output is not bit-identical to eager" in out


def test_a_bad_compile_mode_is_one_line_and_exit_2(demo_model_dir: Path, capsys, loads):
    assert main(["plan", "--model", str(demo_model_dir), "--compile", "max"]) == 2
    assert loads == []
    assert "--compile: invalid choice: 'max'" in one_error_line(capsys)


def test_run_reports_the_compile_phase_and_dynamos_counts(demo_model_dir: Path, tmp_path: Path, capsys):
    out = tmp_path / "o.png"
    assert main(["run", "--headless", "--model", str(demo_model_dir), "--device", "cpu", "--output", str(out),
                 "--steps", "2", "--compile", "regional", "--compile-backend", "eager", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    compiled = report["compile"]
    assert compiled["on"] is True and compiled["compiles"] > 0 and compiled["graph_breaks"] == 0
    assert compiled["seconds"] > 0 and compiled["expect"] in ("cold", "warm", "in memory")
    assert out.is_file()
    assert main(["run", "--headless", "--model", str(demo_model_dir), "--device", "cpu", "--output",
                 str(tmp_path / "p.png"), "--steps", "2", "--compile", "regional", "--compile-backend", "eager"]) == 0
    text = capsys.readouterr().out
    assert "compile (regional)" in text and "recompiles" in text


def test_what_a_run_measured_the_next_plan_reads(demo_model_dir: Path, tmp_path: Path, capsys, monkeypatch):
    """The run records its compile seconds and workspace under the key `plan` reads: the same device name and the
    installed torch's version (a CUDA wheel's `torch.__version__` carries a local label its package metadata lacks,
    set here; the key does not depend on it). On a CPU no allocator measures a workspace: the value CUDA's step
    peaks would give is set."""
    import torch

    from omni_console.engine.running import request_compile

    torch._dynamo.reset()  # earlier tests' graphs would leave this run nothing to compile
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(torch, "__version__", f"{torch.__version__}+cu999")
    monkeypatch.setattr(request_compile, "compile_workspace", lambda first, later: 7 << 20)
    args = ["--model", str(demo_model_dir), "--device", "cpu", "--compile", "regional", "--compile-backend", "eager",
            "--json"]
    assert main(["plan", *args]) == 0
    before = json.loads(capsys.readouterr().out)["compile"]
    assert (before["expect"], before["seconds_source"], before["workspace_source"]) == ("cold", "estimated",
                                                                                        "estimated")
    assert main(["run", "--headless", "--output", str(tmp_path / "o.png"), "--steps", "2", *args]) == 0
    ran = json.loads(capsys.readouterr().out)["compile"]
    assert ran["compiles"] > 0 and ran["workspace_bytes"] == 7 << 20
    assert main(["plan", *args]) == 0
    after = json.loads(capsys.readouterr().out)["compile"]
    assert (after["workspace_source"], after["workspace_bytes"]) == ("measured", 7 << 20)
    # the next start is warm (Inductor's cache): a share of the measured cold seconds until one is measured
    assert after["expect"] == "warm" and after["seconds"] == pytest.approx(WARM_SHARE * ran["seconds"], abs=2e-3)


def test_the_compile_phase_is_a_line_live_and_on_stderr():
    from omni_console.console.event_text import format_event, progress_line
    from omni_console.engine.events import CompilePhase

    cold = CompilePhase(request_id=1, on=True, why="asked", expect="cold", seconds=41.25, forecast_seconds=50.0,
                        compiles=3, recompiles=1, graph_breaks=0)
    text, _ = progress_line(cold)
    assert text == ("request 1: compile 41.2 s cold (forecast 50.0 s); 3 compiled, 1 recompiles, 0 graph breaks")
    assert "COMPILE request 1: compile 41.2 s cold" in format_event(cold, cold.t)
    off = CompilePhase(request_id=2, on=False, why="transfer-bound: the link sets the step time, compile saves "
                       "nothing", expect=None, seconds=0.0, forecast_seconds=0.0, compiles=0, recompiles=0,
                       graph_breaks=0)
    assert progress_line(off)[0] == ("request 2: compile off (transfer-bound: the link sets the step time, compile "
                                     "saves nothing)")


def test_compile_with_several_gpus_is_refused_in_one_line(demo_model_dir: Path, tmp_path: Path, capsys, loads):
    code = main(["run", "--headless", "--model", str(demo_model_dir), "--device", "cpu", "--gpus", "2",
                 "--compile", "regional", "--output", str(tmp_path / "o.png")])
    assert code == 2 and loads == []
    assert one_error_line(capsys) == ("omni-console: error: --compile with --gpus N > 1: the rank group does not "
                                      "compile yet (one GPU does)")
