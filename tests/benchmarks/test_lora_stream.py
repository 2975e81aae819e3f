"""benchmarks/lora_stream.py runs end to end on a CPU at a tiny size (the GPU run is the lead's: gpu_run.sh lora)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # three tiny streamed transformers, a dozen forwards
def test_the_lora_benchmark_prints_ratios_and_its_loras_change_the_output(tmp_path: Path) -> None:
    out = tmp_path / "lora.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.lora_stream", "--device", "cpu", "--preset", "small",
                           "--res", "32", "--rank", "2", "--iters", "1", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    for run in ("bf16", "fp8"):
        r = report[run]
        for mode in ("merge", "sidecar"):
            assert r[f"{mode}_ratio"] == pytest.approx(r[f"{mode}_step_s"] / r["no_lora_step_s"])
            assert r[f"{mode}_changes_output"]
        assert r["merge_vs_sidecar_max_abs"] < r["lora_effect_max_abs"]  # the same LoRA both ways
    assert report["bf16"]["merge_switch_s"] > 0 and report["host"]["lora_bytes"] > 0
    assert set(report["targets_met"]) == {"bf16_merge", "bf16_sidecar", "fp8_merge", "fp8_sidecar", "switch_merge",
                                          "switch_sidecar", "host_growth"}
    assert "= " in done.stdout and "x no LoRA (target <= 1.03x)" in done.stdout
