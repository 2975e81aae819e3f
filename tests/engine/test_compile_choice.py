"""`--compile auto`: on only where the device supports it and the forecast pays the compile back within the request;
the plan's lines say cold or warm, how long (measured or estimated), the workspace and the exactness."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omni_console.engine.planning import compile_record
from omni_console.engine.planning.compile_choice import (
    COMPUTE_GAIN,
    CompileRecord,
    DeviceSupport,
    choose_compile,
    step_gain,
)

GPU = DeviceSupport(cuda=True, triton=True, capability=(9, 0))
CPU = DeviceSupport(cuda=False, triton=False, capability=None)


def _choose(asked: str = "auto", device: DeviceSupport = GPU, *, steps: int = 28, compute: float | None = 2.0,
            transfer: float = 0.5, record: CompileRecord | None = None, warm: bool = False):
    return choose_compile(asked, device, classes=2, steps=steps, compute_s=compute, transfer_s=transfer,
                          largest_block_bytes=400 << 20, record=record, warm_cache=warm)


def test_auto_is_off_on_a_cpu_and_without_triton_or_an_old_card():
    assert not _choose(device=CPU).on and "no CUDA device" in _choose(device=CPU).why
    assert "Triton" in _choose(device=DeviceSupport(True, False, (9, 0))).why
    assert "capability 6.1" in _choose(device=DeviceSupport(True, True, (6, 1))).why


def test_auto_is_off_where_the_link_sets_the_step():
    choice = _choose(compute=1.0, transfer=1.2)
    assert not choice.on and choice.why.startswith("transfer-bound")


def test_auto_is_on_where_compute_bound_steps_pay_the_compile_back():
    choice = _choose(steps=50, compute=10.0, transfer=0.5)
    assert choice.on and choice.expect == "cold" and choice.seconds_source == "estimated"
    assert choice.gain_s == pytest.approx(50 * COMPUTE_GAIN * 10.0)


def test_auto_is_off_when_a_short_request_would_not_pay_back_a_cold_compile():
    choice = _choose(steps=2, compute=1.0, transfer=0.0)
    assert not choice.on and "does not pay back" in choice.why


def test_a_measured_warm_start_is_forecast_from_the_record():
    record = CompileRecord(cold_s=40.0, warm_s=3.5, workspace_bytes=123 << 20, max_abs_diff=0.004)
    choice = _choose("regional", record=record)
    assert (choice.expect, choice.seconds, choice.seconds_source) == ("warm", 3.5, "measured")
    assert choice.workspace_bytes == 123 << 20 and choice.workspace_source == "measured"
    lines = choice.lines()
    assert "warm start, ~3.5 s (measured)" in lines[0]
    assert "not bit-identical to eager (Inductor" in lines[2] and "0.004" in lines[2]


def test_regional_is_on_where_asked_and_says_what_the_device_lacks():
    choice = _choose("regional", CPU)
    assert choice.on and "no CUDA device" in choice.why


@given(compute=st.floats(0, 100), transfer=st.floats(0, 100))
def test_a_compiled_step_never_beats_the_link(compute, transfer):
    gain = step_gain(compute, transfer)
    assert 0 <= gain <= max(compute - transfer, 0) + 1e-9
    assert gain <= COMPUTE_GAIN * compute + 1e-9


def test_a_hostile_record_is_ignored_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path))
    sig = compile_record.signature("FluxPipeline", ["FluxTransformerBlock"], "64x64", "cuda:0", "inductor", None, "2")
    compile_record.compile_root().mkdir(parents=True)
    path = compile_record.compile_root() / f"{sig}.json"
    path.write_text('{"cold_s": "soon", "warm_s": -1, "max_abs_diff": 1e400}')
    record, problem = compile_record.read_record(sig)
    assert problem is None and record == CompileRecord()
    (compile_record.compile_root() / f"{sig}.json").write_text("[1, 2")
    assert compile_record.read_record(sig) == (None, f"compile record {sig}: not a JSON object; ignored")
    (compile_record.compile_root() / f"{sig}.json").unlink()
    (compile_record.compile_root() / f"{sig}.json").symlink_to("/dev/zero")
    record, problem = compile_record.read_record(sig)
    assert record is None and "symbolic link" in problem


def test_measured_phases_are_kept_per_signature(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path))
    compile_record.save_measured("abc", 30.0, cold=True, workspace_bytes=5)
    compile_record.save_measured("abc", 2.0, cold=False)
    record, _ = compile_record.read_record("abc")
    assert record == CompileRecord(cold_s=30.0, warm_s=2.0, workspace_bytes=5)


def test_a_vram_budget_holds_the_compile_workspace_back(demo_model_dir):
    from omni_console.engine.api import EngineOptions, GenerateRequest, open_engine, planner, service
    from omni_console.engine.planning.compile_plan import budget_workspace, largest_block_bytes

    request = GenerateRequest(prompt="a", height=64, width=64)
    engines = [open_engine(demo_model_dir, device="cpu", options=EngineOptions(compile=c)) for c in ("off", "auto")]
    try:
        plan = engines[0].make_plan(planner.build_policy())
        budget = engines[0].model.nbytes * 2
        off, auto = (service.plan_run(e, plan, budget, None, request) for e in engines)
        held, line = budget_workspace(plan, "auto")
        assert held == int(0.5 * largest_block_bytes(plan)) > 0
        assert line is not None and auto.reasons[-1] == line and line not in off.reasons
        assert "held back from the budget (estimated" in line
    finally:
        for e in engines:
            e.close()
