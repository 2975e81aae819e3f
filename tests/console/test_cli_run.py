"""`omni-console run --headless`: the image, the report an operator reads, and clear failures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from omni_console.console.cli import main


def test_headless_run_writes_image_and_json_report(demo_model_dir: Path, tmp_path: Path, capsys):
    out = tmp_path / "img" / "out.png"
    code = main(["run", "--headless", "--model", str(demo_model_dir), "--output", str(out), "--seed", "3",
                 "--dlo-offload-components", '{"vae": false}', "--resident-layers", "1", "--json"])
    assert code == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout is the document alone; progress goes to stderr as without --json
    assert "state ready → running" in captured.err and "step 2/2" in captured.err
    image = Image.open(out)
    assert image.size == (64, 64) and np.asarray(image).std() > 0
    assert report["policy"] == {"mode": "dlo", "dlo_offload_components": {"vae": False}, "resident_layers": 1,
                                "placement": "leading", "prefetch_slots": 2, "stream_dtype": None,
                                "fp8_modulation": False, "stream_encoders": "auto", "vae_tiling": "auto",
                                "vae_slicing": "auto", "ff_chunking": "auto", "lean_auto": [],
                                "upcast_resident": "auto"}
    assert report["lean_phases"] == []  # no budget, no lean flag: every phase as plain diffusers runs it
    assert [s["step"] for s in report["steps"]] == [1, 2]
    phases = report["load_phases"]  # where the load's time went, adding up to the load time
    assert set(phases) == {"read", "arrange", "register"} and phases["read"] > 0
    assert sum(phases.values()) == pytest.approx(report["load_seconds"], abs=1e-3)
    milestones = report["load_milestones"]
    assert 0 < milestones["dits_built"] <= milestones["dits_placed"] <= report["load_seconds"]
    assert all(s["wall_s"] > 0 for s in report["steps"])
    # 5 of 6 DiT blocks streamed per step, plus the two staged text encoders (the VAE is resident)
    assert report["staging"]["h2d_bytes"] > report["forecast"]["streamed_bytes_per_forward"]
    assert report["staging"]["h2d_bytes_per_s"] > 0
    # one forward's copies carry the plan's streamed weights plus the packed layout's padding, and every
    # step of this one-forward-per-step pipeline copies exactly that
    weights, copied = report["forecast"]["streamed_bytes_per_forward"], report["copied_bytes_per_forward"]
    assert 0 < weights <= copied < 2 * weights
    assert all(s["h2d_bytes"] == copied for s in report["steps"])
    assert report["telemetry"]["samples"] >= 1 and report["telemetry"]["host_rss_peak"] > 0
    if report["device"] == "cpu":
        assert any("no CUDA device" in line for line in report["telemetry"]["final"])
    assert report["cache_decisions"] and report["load_seconds"] > 0


def test_headless_run_text_report(demo_model_dir: Path, tmp_path: Path, capsys):
    assert main(["run", "--headless", "--model", str(demo_model_dir), "--output", str(tmp_path / "o.png"),
                 "--resident-layers", "1"]) == 0
    captured = capsys.readouterr()
    for label in ("load time", "steps", "cache decisions", "peak RSS"):
        assert label in captured.out
    # the copied bytes are labelled against the weights `plan` names (never two unlabelled figures)
    copied = re.search(r"copied per DiT forward\s*│\s*(\S+ \S+) \((\S+ \S+) of weights \+", captured.out)
    assert copied, captured.out
    plan_out = _plan_text(demo_model_dir, capsys)
    assert re.search(rf"streamed per DiT forward \(5 blocks\)\t{re.escape(copied[2])}\n", plan_out), plan_out
    # the steps' own table, a figure per column: each step copied what a forward copies (one forward a step)
    header = next(n for n, line in enumerate(captured.out.splitlines()) if line.split()[:4] == ["step", "time",
                                                                                            "stall", "copied"])
    rows = [line.split() for line in captured.out.splitlines()[header + 1:header + 3]]
    assert [row[0] for row in rows] == ["1", "2"]
    assert all(" ".join(row[-2:]) == copied[1] for row in rows), rows
    tables = [line for line in captured.out.splitlines() if line[:1] in "│┌└├" or line.split()[:1] in (["1"], ["2"])]
    assert max(map(len, tables)) <= 80  # the tables fit the terminal (only paths, after them, may be wider)
    if not torch.cuda.is_available():  # CPU words on a CPU: no link, no rate, no pinned memory
        assert "host copies (CPU: no device link)" in captured.out
        for gpu_word in ("host→device", "H2D", "GB/s", "MB/s"):
            assert gpu_word not in captured.out, gpu_word
    assert "state ready → running" in captured.err and "step 2/2" in captured.err


def _plan_text(model: Path, capsys) -> str:
    assert main(["plan", "--model", str(model), "--resident-layers", "1"]) == 0
    return capsys.readouterr().out


def test_version_is_one_line_and_exit_0(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"omni-console {version('omni-console')}\n"


def test_headless_run_invalid_policy_exit_2(demo_model_dir: Path, capsys):
    assert main(["run", "--headless", "--model", str(demo_model_dir), "--dlo-offload-components",
                 '{"transformer": true}']) == 2
    assert "DLO always owns DiT offload" in capsys.readouterr().err


def test_headless_run_load_failure_exit_1_one_line(demo_model_dir: Path, tmp_path: Path, capsys, monkeypatch):
    from omni_console.offload import streamer

    def boom(self):
        raise RuntimeError("pinning failed on purpose")

    monkeypatch.setattr(streamer.LayerwiseStreamer, "attach", boom)
    assert main(["run", "--headless", "--model", str(demo_model_dir), "--output", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert "omni-console: load failed: RuntimeError: pinning failed on purpose" in err and "Traceback" not in err
    assert not (tmp_path / "x.png").exists()


def test_run_is_headless_without_the_flag(demo_model_dir: Path, tmp_path: Path, capsys):
    out = tmp_path / "plain.png"
    assert main(["run", "--model", str(demo_model_dir), "--output", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["output"] == str(out) and Image.open(out).size == (64, 64)


def test_demo_defaults_apply_to_the_demo_only(demo_model_dir: Path, wan_model_dir: Path):
    """The demo's working defaults (64 px, 2 steps) must not leak onto other tiny models: a Wan
    request with nothing set takes the Wan pipeline's own defaults."""
    from omni_console.console.headless import default_request
    from omni_console.engine.engine import Engine

    demo = default_request(Engine(demo_model_dir, device="cpu"), prompt="x")
    assert (demo.steps, demo.height, demo.width) == (2, 64, 64)
    wan = default_request(Engine(wan_model_dir, device="cpu"), prompt="x")
    assert (wan.steps, wan.height, wan.width, wan.guidance, wan.extra) == (None, None, None, None, {})
