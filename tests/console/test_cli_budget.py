"""`--placement`, `--prefetch-slots` and `--vram-budget` as the operator sees them in `plan` and `run`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import one_error_line

from omni_console.console.cli import main
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.request_profile import profile_dir


def _plan(capsys, model: Path, *flags: str) -> dict:
    assert main(["plan", "--model", str(model), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_spread_placement_and_ring_depth_show_in_the_plan_and_the_export_says_what_it_cannot(demo_model_dir, capsys):
    doc = _plan(capsys, demo_model_dir, "--resident-layers", "3", "--placement", "spread", "--prefetch-slots", "3")
    f = doc["forecast"]
    assert doc["policy"]["placement"] == "spread" and doc["policy"]["prefetch_slots"] == 3
    assert f["placement"] == "spread" and f["streaming_slots"] == 3 and len(f["resident_block_indices"]) == 3
    assert f["resident_block_indices"] != [0, 1, 2]  # not the leading ones
    assert not doc["vllm_omni"]["exact"]
    gaps = " ".join(doc["vllm_omni"]["gaps"])
    assert "spread" in gaps and "3-slot" in gaps
    leading = _plan(capsys, demo_model_dir, "--resident-layers", "3")
    assert leading["vllm_omni"]["exact"] and leading["forecast"]["resident_block_indices"] == [0, 1, 2]
    assert leading["request_forecast"]["peak_source"] in ("unknown", "cached", "estimated")


@pytest.mark.parametrize(("flags", "words"), [(["--prefetch-slots", "1"], "prefetch slots must be >= 2"),
                                              (["--vram-budget", "lots"], "--vram-budget must be a size"),
                                              (["--vram-budget", "1MB"], "nothing fits in 1.0 MB"),
                                              (["--vram-budget", "8G", "--mode", "resident"], "cannot be combined")])
def test_refused_budget_and_depth_are_one_line_exit_2(demo_model_dir, capsys, flags, words):
    assert main(["plan", "--model", str(demo_model_dir), *flags]) == 2
    assert words in one_error_line(capsys)


def test_budget_keeps_everything_resident_when_it_fits_and_streams_when_it_does_not(demo_model_dir, capsys):
    for old in profile_dir().glob("*.json") if profile_dir().is_dir() else []:  # a fresh install: no profile
        old.unlink()
    model = discover_model(demo_model_dir)
    roomy = _plan(capsys, demo_model_dir, "--vram-budget", f"{model.nbytes * 2}B")
    assert roomy["forecast"]["num_streamed_blocks"] == 0
    assert all(c["residency"] != "staged" for c in roomy["components"])
    assert roomy["auto_plan"]["budget_bytes"] == model.nbytes * 2 and roomy["auto_plan"]["reasons"]
    tight_budget = roomy["forecast"]["peak_device_weight_bytes"] - 1
    tight = _plan(capsys, demo_model_dir, "--vram-budget", f"{tight_budget}B")
    assert tight["request_forecast"]["peak_bytes"] <= tight_budget
    assert tight["forecast"]["num_streamed_blocks"] > 0 or any(c["residency"] == "staged" for c in tight["components"])


@pytest.mark.slow
def test_run_reports_the_budget_choice_and_then_checks_its_forecast(demo_model_dir, tmp_path, capsys):
    for old in profile_dir().glob("*.json") if profile_dir().is_dir() else []:
        old.unlink()
    model = discover_model(demo_model_dir)
    budget = f"{model.nbytes}B"  # above the smallest peak with the estimated activations, below all resident
    args = ["run", "--model", str(demo_model_dir), "--device", "cpu", "--json", "--vram-budget", budget]
    assert main([*args, "--output", str(tmp_path / "a.png")]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["auto_plan"]["budget_bytes"] == model.nbytes and first["auto_plan"]["reasons"]
    assert first["forecast_check"]["predicted_step_s"] is None  # nothing measured before the first run
    assert first["forecast_check"]["measured_step_s"] > 0
    assert main([*args, "--output", str(tmp_path / "b.png")]) == 0
    second = json.loads(capsys.readouterr().out)
    check = second["forecast_check"]
    assert check["step_source"] == "cached" and check["predicted_step_s"] > 0
    assert check["step_error"] == pytest.approx(check["predicted_step_s"] / check["measured_step_s"] - 1)
