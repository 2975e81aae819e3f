"""benchmarks/before_after.py: each install's runs, their spread, and a verdict that tells noise from a change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.before_after import compare, figures, paired, report_lines, summary

ROOT = Path(__file__).resolve().parents[2]


def _run(load: float, step: float, phases: dict[str, float] | None = None) -> dict:
    return {"exit": 0, "load_s": load, "steady_step_s": step, "load_phases": phases or {"read": load * 0.6},
            "load_milestones": {"dits_placed": load * 0.5}}


def _doc(a_loads: list[float], b_loads: list[float]) -> dict:
    runs = {"a": [_run(9.0, 0.5)] + [_run(x, 0.41) for x in a_loads],  # the warm-up first: never counted
            "b": [_run(9.0, 0.5)] + [_run(x, 0.41) for x in b_loads]}
    a, b = summary(runs["a"]), summary(runs["b"])
    return {"a": a, "b": b, "runs": runs,
            "compare": {"load_s": compare(a["load_s"], b["load_s"], paired(runs, "load_s")),
                        "step_s": compare(a["step_s"], b["step_s"], paired(runs, "steady_step_s"))}}


def test_each_counted_run_its_median_and_spread_are_reported_and_the_warm_up_is_not() -> None:
    doc = _doc([2.0, 2.2, 1.9, 2.1], [2.1, 2.0, 2.3, 1.95])
    load = doc["a"]["load_s"]
    assert load["each"] == [2.0, 2.2, 1.9, 2.1] and doc["a"]["runs"] == 4
    assert load["median"] == pytest.approx(2.05) and load["spread"] == pytest.approx(0.3 / 2.05)
    assert doc["compare"]["load_s"]["pair_ratios"] == [1.05, round(2.0 / 2.2, 4), round(2.3 / 1.9, 4), 0.9286]
    text = "\n".join(report_lines(doc))
    assert "runs 2.000, 2.200, 1.900, 2.100" in text and "spread 14.6 %" in text
    assert "b/a 1.0" in text and "within noise" in text


def test_a_slower_load_is_called_out_only_when_it_is_beyond_both_spreads() -> None:
    slower = _doc([1.9, 2.0, 2.1, 1.95], [2.3, 2.5, 2.4, 2.35])
    assert slower["compare"]["load_s"]["verdict"] == "slower beyond the noise"
    assert slower["compare"]["load_s"]["b_over_a"] == pytest.approx(2.375 / 1.975, abs=1e-4)
    faster = _doc([2.3, 2.5, 2.4, 2.35], [1.9, 2.0, 2.1, 1.95])
    assert faster["compare"]["load_s"]["verdict"] == "faster beyond the noise"
    overlapping = _doc([1.9, 2.3, 2.0, 2.2], [2.25, 2.5, 2.4, 2.35])  # b's fastest is faster than a's slowest
    assert overlapping["compare"]["load_s"]["verdict"] == "within noise"
    assert "read: 1.260 -> 1.425 (+0.165)" in "\n".join(report_lines(overlapping))  # where in the load it lies


def test_failed_runs_are_counted_apart_and_no_figure_comes_from_them() -> None:
    runs = [_run(9.0, 0.5), _run(2.0, 0.4), {"exit": 1, "wall_s": 3.0, "error": "load failed: x"}, _run(2.2, 0.42)]
    s = summary(runs)
    assert s["runs"] == 2 and s["failed"] == 1 and s["load_s"]["each"] == [2.0, 2.2]
    assert figures([]) is None and compare(None, s["load_s"], []) is None


@pytest.mark.slow
def test_two_installs_are_alternated_and_both_reported(tmp_path: Path, demo_model_dir: Path) -> None:
    sites = []
    for name in ("a", "b"):  # two installs of this checkout: a folder of links, as its docstring says
        package = tmp_path / name / "omni_console"
        package.mkdir(parents=True)
        for part in ("engine", "console", "offload", "themes"):
            (package / part).symlink_to(ROOT / part)
        sites.append(tmp_path / name)
    out = tmp_path / "ba.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.before_after", "--site-a", str(sites[0]), "--site-b", str(sites[1]),
         "--runs", "1", "--settle-s", "0", "--out", str(out), "--", "--model", str(demo_model_dir), "--device", "cpu",
         "--height", "64", "--width", "64", "--steps", "2", "--prompt", "a fox"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ})
    assert done.returncode == 0, done.stdout + done.stderr
    order = [line.split()[1] for line in done.stdout.splitlines() if " run " in line and line.startswith("[")]
    assert order == ["a", "b", "b", "a"]  # ABBA: the counted round runs b first
    doc = json.loads(out.read_text())
    assert doc["a"]["runs"] == doc["b"]["runs"] == 1
    assert doc["compare"]["load_s"]["verdict"] in ("within noise", "slower beyond the noise", "faster beyond the noise")
    assert "time to ready (load_seconds):" in done.stdout and "load_milestones (median s, a -> b):" in done.stdout
