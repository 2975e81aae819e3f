"""benchmarks/compile_stream.py must work the first time on the GPU machine: on a CPU with the eager backend it runs
the whole script on the small Flux preset, through a re-plan, and reports the ratios the issue reads."""

from __future__ import annotations

import json

import pytest

from benchmarks.compile_stream import main


@pytest.mark.slow  # resident, two budgets streamed (a re-plan between), eager and compiled
def test_the_cpu_smoke_run_reports_ratios_recompiles_and_exactness(tmp_path):
    out = tmp_path / "compile.json"
    report = main(["--device", "cpu", "--model", "flux-small", "--backend", "eager", "--budgets", "0.001", "0.01",
                   "--iters", "1", "--text-tokens", "16", "--stream-dtype", "float8_e4m3fn", "--out", str(out)])
    assert json.loads(out.read_text())["model"] == "flux-small"
    budgets, across = report["streamed"][:-1], report["streamed"][-1]
    assert [r["budget_gb"] for r in budgets] == [0.001, 0.01]
    for row in budgets:
        assert row["recompiles_after_warmup"] == 0 and row["compiles_after_warmup"] == 0
        assert row["equals_diffusers_regional_compile"] and row["stream_eager_equals_resident_eager"]
        assert row["compiled_over_resident_eager"] > 0 and row["compiled_over_stream_eager"] > 0
    assert across["compiles_after_first_warmup"] == 0
    fp8 = report["fp8"]  # the eager backend runs eager's kernels: the compiled fp8 step equals the uncompiled one
    assert fp8["recompiles_after_warmup"] == 0 and fp8["max_abs_diff_compiled_vs_fp8_eager"] == 0.0
    assert fp8["compiled_over_fp8_eager"] > 0 and fp8["compiled_over_resident_bf16_eager"] > 0
