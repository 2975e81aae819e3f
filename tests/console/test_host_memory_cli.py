"""Issue 35 item 1: `plan` and `run` give the process's host memory (peak RSS) per phase, and a run's
measured peak against it; the next forecast of the same plan learns from that run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_console.console.cli import main
from omni_console.engine.model_dir.discovery import discover_model

SIZE = ["--device", "cpu", "--height", "64", "--width", "64"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(root))
    return root


def plan_json(capsys, model: Path, *extra: str) -> dict:
    assert main(["plan", "--model", str(model), *SIZE, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_json_gives_the_host_peak_per_phase_from_its_parts(demo_model_dir: Path, cache: Path, capsys):
    host = plan_json(capsys, demo_model_dir)["request_forecast"]["host"]
    model = discover_model(demo_model_dir)
    blocks = sum(b for c in model.components for bl in c.block_lists for b in bl.block_bytes)
    staged = sum(model.component(n).nbytes for n in ("text_encoder", "text_encoder_2", "vae"))
    parts = {p["name"]: p for p in host["parts"]}
    assert parts["pinned blocks"]["bytes"] == blocks
    assert parts["pinned staged masters"]["bytes"] == staged
    assert parts["decoded output"]["bytes"] == 64 * 64 * 3 * 5 and parts["decoded output"]["phases"] == ["vae_decode"]
    for phase, peak in host["phase_peaks"].items():
        assert peak == sum(p["bytes"] for p in host["parts"] if phase in p["phases"])
    assert host["peak_bytes"] == max(host["phase_peaks"].values()) == host["phase_peaks"][host["peak_phase"]]
    assert host["baseline_source"] == "default" and host["live_replan"] is False


def test_resident_components_leave_the_host_forecast(demo_model_dir: Path, cache: Path, capsys):
    """On a CPU the device is the host: a resident VAE moves from the masters to the device's weights."""
    staged = plan_json(capsys, demo_model_dir)["request_forecast"]["host"]
    resident = plan_json(capsys, demo_model_dir, "--dlo-offload-components", '{"vae": false}')["request_forecast"]
    vae = discover_model(demo_model_dir).component("vae").nbytes
    parts = {p["name"]: p["bytes"] for p in resident["host"]["parts"]}
    before = {p["name"]: p["bytes"] for p in staged["parts"]}
    assert before["pinned staged masters"] - parts["pinned staged masters"] == vae


def test_plan_piped_shows_the_host_rows(demo_model_dir: Path, cache: Path, capsys):
    assert main(["plan", "--model", str(demo_model_dir), *SIZE]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    peak = next(r for r in rows if r[0].startswith("host peak RSS ("))
    assert peak[2] == "default baseline" and peak[1].endswith("MB")
    assert {r[0].strip() for r in rows} >= {"load", "text encoding", "denoise", "VAE decode",
                                            "of which pinned blocks", "of which decoded output"}


def run_json(capsys, model: Path, out: Path) -> dict:
    assert main(["run", "--model", str(model), *SIZE, "--steps", "2", "--output", str(out), "--overwrite",
                 "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_run_reports_measured_peak_rss_and_the_next_forecast_learns_it(demo_model_dir: Path, cache: Path,
                                                                        tmp_path: Path, capsys):
    first = run_json(capsys, demo_model_dir, tmp_path / "a.png")
    assert first["host_forecast_source"] == "default"
    measured, predicted = first["host_peak_bytes"], first["predicted_host_peak_bytes"]
    assert measured > 100_000_000 and predicted > 0  # python + torch alone are more than 100 MB
    assert first["host_peak_error"] == pytest.approx((predicted - measured) / measured)
    # this process ran other tests before: its VmHWM is at least the run's, so learning is checked
    # on what the profile keeps, and the next forecast of the same plan starts from it
    host = plan_json(capsys, demo_model_dir)["request_forecast"]["host"]
    assert host["baseline_source"] == "cached"
    assert host["peak_bytes"] == pytest.approx(measured, rel=0.03)
    second = run_json(capsys, demo_model_dir, tmp_path / "b.png")
    assert second["host_forecast_source"] == "cached"
    assert abs(second["host_peak_error"]) <= 0.03
    # another plan of the model takes the process base it learned (said so): only the plan's own bytes differ
    other = plan_json(capsys, demo_model_dir, "--resident-layers", "2")["request_forecast"]["host"]
    assert other["baseline_source"] == "cached" and any("another plan" in n for n in other["notes"])
    same = plan_json(capsys, demo_model_dir)["request_forecast"]["host"]  # what the second run taught
    assert other["process_base_bytes"] == same["process_base_bytes"] > 0 and not same["notes"]
