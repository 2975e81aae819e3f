"""The footprint model: a budget is the process's device memory (context + allocator), not torch's allocated peak."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning import device_footprint as fp
from omni_console.engine.planning.auto_plan import NothingFits, auto_plan
from omni_console.engine.planning.device_footprint import DeviceOverhead, device_overhead, record_context
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.request_profile import RequestSize
from omni_console.offload.policy import build_policy

GB = 10**9


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fp, "_versions", lambda: ("2.13.0", "999.1"))
    return tmp_path


@given(context=st.integers(0, 8 * GB), budget=st.integers(1, 200 * GB))
def test_the_allocated_budget_is_the_largest_peak_whose_process_figure_fits(context: int, budget: int):
    o = DeviceOverhead(context, "measured", "GPU")
    alloc = o.allocated_budget(budget)
    if alloc >= 0:
        assert o.process_bytes(alloc) <= budget
        assert o.process_bytes(alloc + 2) > budget  # the largest (to rounding)
    assert o.allocator_cap(budget) == budget - context


def test_cpu_has_no_overhead_and_a_gpu_without_a_measurement_says_default(cache: Path):
    assert device_overhead("cpu").process_bytes(5 * GB) == 5 * GB
    o = device_overhead("NVIDIA H200")
    assert o.context_source == "default" and o.context_bytes == fp.DEFAULT_CONTEXT_BYTES
    assert "default" in o.describe() and "1.0 GB" in o.describe()
    # H200 measurement in the docstring: 24.03 GB reserved, 25.43 GB per process: the default covers it
    assert o.process_bytes(int(24.009 * GB)) >= int(25.43 * GB)


def test_a_measured_context_is_cached_per_device_and_only_grows(cache: Path):
    record_context("NVIDIA H200", 900_000_000)
    record_context("NVIDIA H200", 700_000_000)  # a smaller reading (fewer kernels loaded yet) keeps the larger
    o = device_overhead("NVIDIA H200")
    assert (o.context_source, o.context_bytes) == ("measured", 900_000_000)
    assert device_overhead("NVIDIA A10").context_source == "default"


@pytest.mark.parametrize("content", [b"[1]", b'{"context_bytes": -5}', b'{"context_bytes": 1e99}',
                                     b'{"context_bytes": "9"}', b"\xff\xfe", b"{" * 5000])
def test_a_hostile_cached_footprint_is_ignored_with_a_note(cache: Path, content: bytes):
    path = fp.footprint_path("NVIDIA H200", "2.13.0", "999.1")
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    o = device_overhead("NVIDIA H200")
    assert o.context_source == "default" and "ignored" in o.note


def test_a_symlinked_or_fifo_footprint_is_never_followed(cache: Path):
    path = fp.footprint_path("NVIDIA H200", "2.13.0", "999.1")
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    assert "not a regular file" in device_overhead("NVIDIA H200").note
    path.unlink()
    path.symlink_to("/dev/zero")
    assert "symbolic link" in device_overhead("NVIDIA H200").note


def test_the_planner_fits_the_process_figure_not_the_allocated_peak(demo_model_dir: Path):
    plan0 = make_plan(discover_model(demo_model_dir), build_policy({}, 0))
    plain = auto_plan(plan0, 10 * GB, RequestSize(), None, "unknown", None, "unknown")
    assert plain.forecast.process_peak_bytes is None  # no overhead given: torch's allocated peak only
    overhead = DeviceOverhead(2 * GB, "default", "GPU")
    with_overhead = auto_plan(plan0, 10 * GB, RequestSize(), None, "unknown", None, "unknown", overhead)
    assert any("device memory of the process" in line for line in with_overhead.reasons)
    assert any("CUDA context 2.0 GB (default" in line for line in with_overhead.reasons)
    assert with_overhead.forecast.process_peak_bytes == overhead.process_bytes(with_overhead.forecast.peak_bytes)
    assert with_overhead.forecast.process_peak_bytes <= 10 * GB
    weights = plan0.forecast.peak_device_weight_bytes
    # a budget that fits the weights alone but not the context on top: nothing fits, said in process terms
    with pytest.raises(NothingFits, match="of the process.*CUDA context 2.0 GB"):
        auto_plan(plan0, weights + GB, RequestSize(), None, "unknown", None, "unknown", overhead)
    auto_plan(plan0, weights + GB, RequestSize(), None, "unknown", None, "unknown")  # fits without the overhead


def test_plan_shows_and_exports_the_process_figure_beside_torchs_allocated_peak(demo_model_dir: Path):
    from dataclasses import replace

    from omni_console.console.plan_view import request_sheet
    from omni_console.engine.planning.export import request_forecast_doc
    from omni_console.engine.planning.request_forecast import forecast_request

    plan = make_plan(discover_model(demo_model_dir), build_policy({}, 0))
    forecast = forecast_request(plan, RequestSize(), None, "unknown", None, "unknown")
    gpu = replace(forecast, overhead=DeviceOverhead(GB, "measured", "NVIDIA H200"))
    rows = {row[0]: row for row in request_sheet(gpu).rows}
    process = GB + fp.MIN_MARGIN_BYTES + forecast.peak_bytes
    assert gpu.process_peak_bytes == process
    [label] = [k for k in rows if k.startswith("device memory of the process")]
    assert rows["  torch allocated peak"][1] != rows[label][1]
    assert rows["  outside torch's allocations"][2] == "measured"
    doc = request_forecast_doc(gpu, "NVIDIA H200").model_dump()
    assert (doc["process_peak_bytes"], doc["context_bytes"], doc["context_source"]) == (process, GB, "measured")
    assert doc["peak_bytes"] == forecast.peak_bytes  # the allocated figure stays where it was
    cpu = request_forecast_doc(replace(forecast, overhead=fp.NO_OVERHEAD), "cpu").model_dump()
    assert cpu["process_peak_bytes"] is None and not any(k.startswith("device memory") for k, *_ in
                                                          request_sheet(forecast, on_cpu=True).rows)
