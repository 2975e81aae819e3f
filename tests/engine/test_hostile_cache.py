"""The profile cache is input too: a FIFO, a symlink to /dev/zero, a huge file or out-of-range numbers
in a cached profile never hang, exhaust memory or reach the screen; the profile is ignored with one note."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omni_console.console.cli import main
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.request_profile import (
    MAX_PROFILE_BYTES,
    RequestProfile,
    RequestSize,
    latest_path,
    profile_path,
    save_profile,
)

SIZE = RequestSize(height=64, width=64)
PLAN = ["plan", "--device", "cpu", "--height", "64", "--width", "64"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(root))
    return root


def _good_profile(model_dir: Path) -> RequestProfile:
    model = discover_model(model_dir)
    blocks = sum(len(bl.block_bytes) for c in model.components for bl in c.block_lists)
    return RequestProfile(model=str(model_dir.resolve()), model_bytes=model.nbytes, device="cpu", size=SIZE,
                          block_compute_s=[0.01] * blocks, other_s=0.002, forwards_per_step=1,
                          text_extra_bytes=1000, denoise_extra_bytes=2000, decode_extra_bytes=3000,
                          bandwidth_bytes_per_s=1e9, measured_at="2026-12-01T00:00:00")


def _plan_json(capsys, model_dir: Path) -> dict:
    assert main([*PLAN, "--model", str(model_dir), "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out, parse_constant=lambda c: pytest.fail(f"plan --json emitted {c}"))


def test_a_good_profile_is_used(demo_model_dir: Path, cache: Path, capsys):
    save_profile(_good_profile(demo_model_dir))
    doc = _plan_json(capsys, demo_model_dir)
    request = doc["request_forecast"]
    assert request["step_source"] == "cached" and not any("ignored" in n for n in request["notes"])


@pytest.mark.parametrize(("field", "value"), [
    ("other_s", -5.954), ("other_s", math.nan), ("other_s", math.inf), ("block_compute_s", [-1.0] * 6),
    ("text_extra_bytes", -1_000_000_000_000), ("bandwidth_bytes_per_s", -5.0), ("bandwidth_bytes_per_s", 0.0),
    ("forwards_per_step", 0), ("version", 99), ("size", {"height": -64, "width": 64}),
    ("host_baseline_bytes", -1), ("host_peak_bytes", 1 << 62), ("host_plan", "x" * 65),
])
def test_out_of_range_numbers_are_ignored_with_one_note(demo_model_dir: Path, cache: Path, capsys, field, value):
    path = save_profile(_good_profile(demo_model_dir))
    doc = json.loads(path.read_text())
    doc[field] = value
    path.write_text(json.dumps(doc))  # json.dumps writes NaN / Infinity as Python's json would
    out = _plan_json(capsys, demo_model_dir)
    notes = [n for n in out["request_forecast"]["notes"] if "ignored" in n]
    assert len(notes) == 1 and str(path) in notes[0] and field in notes[0]
    assert out["request_forecast"]["step_source"] != "cached"
    assert main([*PLAN, "--model", str(demo_model_dir)]) == 0
    text = capsys.readouterr().out
    assert text.count("ignored") == 1
    shown = text.replace(notes[0], "")  # the note names the reason; nothing else may show the numbers
    assert "−" not in shown and "-5.954" not in shown and "cached" not in shown
    assert not re.search(r"\b(nan|inf|infinity)\b", shown, re.IGNORECASE)


def test_a_symlink_to_dev_zero_and_a_huge_file_are_not_read(demo_model_dir: Path, cache: Path, capsys):
    path = profile_path(demo_model_dir, discover_model(demo_model_dir).nbytes, "cpu", SIZE)
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/zero")
    start = time.monotonic()
    doc = _plan_json(capsys, demo_model_dir)
    assert time.monotonic() - start < 20
    assert any("symbolic link" in n for n in doc["request_forecast"]["notes"])
    path.unlink()
    with path.open("wb") as f:  # sparse: large on paper, nothing on disk
        f.truncate(MAX_PROFILE_BYTES * 64)
    doc = _plan_json(capsys, demo_model_dir)
    assert any("larger than" in n for n in doc["request_forecast"]["notes"])


@pytest.mark.slow
def test_a_fifo_as_profile_does_not_hang_plan(demo_model_dir: Path, cache: Path):
    path = profile_path(demo_model_dir, discover_model(demo_model_dir).nbytes, "cpu", SIZE)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    latest_path(demo_model_dir, discover_model(demo_model_dir).nbytes, "cpu").symlink_to(path)  # the newest too
    env = {**os.environ, "OMNI_CONSOLE_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-m", "omni_console.console.cli", *PLAN, "--model", str(demo_model_dir)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "not a regular file" in done.stdout and "Traceback" not in done.stderr


def test_a_fifo_as_the_demo_cache_marker_is_refused_without_waiting(tmp_path: Path):
    import threading

    from omni_console.engine.demo.build_dir import COMPLETE_MARKER, manifest_mismatch

    folder = tmp_path / "demo"
    folder.mkdir()
    os.mkfifo(folder / COMPLETE_MARKER)
    result: list[str | None] = []
    worker = threading.Thread(target=lambda: result.append(manifest_mismatch(folder)), daemon=True)
    worker.start()
    worker.join(20)
    assert result and result[0] is not None and "regular file" in result[0]


def test_a_fifo_among_other_sizes_profiles_does_not_block_the_forecast(demo_model_dir: Path, cache: Path):
    """The console's forecast (any size) reads the model's newest profile: a FIFO there is refused, not waited on."""
    import threading

    from omni_console.engine.planning.plan import make_plan
    from omni_console.engine.planning.request_forecast import forecast_for
    from omni_console.offload.policy import build_policy

    latest = latest_path(demo_model_dir, discover_model(demo_model_dir).nbytes, "cpu")
    latest.parent.mkdir(parents=True)
    os.mkfifo(latest)
    plan = make_plan(discover_model(demo_model_dir), build_policy())
    result: list = []
    worker = threading.Thread(target=lambda: result.append(forecast_for(plan, RequestSize(height=32, width=32), "cpu")),
                              daemon=True)
    worker.start()
    worker.join(30)
    assert result, "the forecast blocked on a FIFO in the profile cache"
    assert any(f"{latest} ignored: is not a regular file" in n for n in result[0].notes)
