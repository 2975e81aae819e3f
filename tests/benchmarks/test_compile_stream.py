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
    resident = report["resident"]  # the compile workspace beside its estimate (0 on a CPU: no allocator peak)
    assert resident["compile_workspace_bytes"] == 0 and resident["workspace_estimate_bytes"] > 0


@pytest.mark.slow  # four fresh processes (cold and warm, for each path)
def test_the_phases_time_the_engines_path_beside_diffusers(tmp_path):
    """`--phases` times the engine's regional compile (`ours`) beside diffusers' `compile_repeated_blocks` (the
    top-level keys, as before), each with its graphs, cache counters and Dynamo's timers."""
    report = main(["--device", "cpu", "--model", "flux-small", "--backend", "eager", "--budgets", "--phases",
                   "--text-tokens", "16", "--out", str(tmp_path / "phases.json")])
    phase = report["compile_phase"]
    ours, diffusers = phase["ours"], phase
    assert ours["cold"]["path"] == ours["warm"]["path"] == "ours" and diffusers["cold"]["path"] == "diffusers"
    # one graph per block class on our path; diffusers' compiles Flux's single block again for its sliced inputs
    assert ours["cold"]["graphs"] == ours["warm"]["graphs"] == 2 and ours["cold"]["recompiles"] == 0
    assert diffusers["cold"]["graphs"] == 3
    for pair in (ours, diffusers):
        assert pair["cold"]["compile_phase_s"] > 0 and pair["warm_over_cold"] is not None
        assert pair["cold"]["timers"]["bytecode_tracing"] > 0
