"""`run`'s device memory of the process: the forecast's figure next to NVML's, the allocator setting left to
an operator who chose one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from omni_console.console.run_memory import ALLOC_CONF, RunMemory, prefer_expandable_segments
from omni_console.engine.device_footprint import DeviceOverhead, margin_for

GB = 10**9


def test_the_forecast_process_figure_is_allocated_plus_the_counted_overhead_and_its_error_against_nvml():
    overhead = DeviceOverhead(GB, "measured", "GPU")
    memory = RunMemory(torch.device("cuda"), "GPU", overhead=overhead)
    doc = memory.predicted(SimpleNamespace(predicted_peak=10 * GB), measured=12 * GB)
    expected = 10 * GB + GB + margin_for(10 * GB)
    assert doc["predicted_process_peak_bytes"] == expected and doc["context_source"] == "measured"
    assert doc["process_peak_error"] == pytest.approx((expected - 12 * GB) / (12 * GB))
    assert memory.predicted(SimpleNamespace(predicted_peak=None), 12 * GB) == {}  # nothing predicted yet


def test_on_a_cpu_there_is_nothing_to_measure_and_no_cap():
    memory = RunMemory.start(torch.device("cpu"), "cpu", 8 * GB, None)
    doc = memory.finish()
    assert doc["process_peak_bytes"] is None and "cpu" in doc["process_peak_note"]
    assert doc["allocator_cap_bytes"] is None and memory.predicted(SimpleNamespace(predicted_peak=GB), None) == {}


def test_expandable_segments_are_asked_for_only_when_the_operator_set_nothing(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(ALLOC_CONF, "max_split_size_mb:128")
    assert not prefer_expandable_segments()
    import os

    assert os.environ[ALLOC_CONF] == "max_split_size_mb:128"
    monkeypatch.setenv(ALLOC_CONF, "")  # empty: torch's defaults, chosen
    assert not prefer_expandable_segments() and os.environ[ALLOC_CONF] == ""
    monkeypatch.delenv(ALLOC_CONF)
    assert prefer_expandable_segments() and os.environ[ALLOC_CONF] == "expandable_segments:True"


def test_a_step_down_is_one_log_line_and_one_progress_line():
    from omni_console.console.event_text import format_event, progress_line
    from omni_console.engine.events import OomStepDown

    event = OomStepDown(request_id=1, phase="vae_decode", component="vae", action="DiT resident blocks 8→0",
                        message="CUDA out of memory. Tried to allocate 2.00 GiB\x1b]52;c;x\x07", t=5.0)
    log = format_event(event, t0=0.0)
    assert ("OOM VAE decode (vae) — cache released, stepped down: DiT resident blocks 8→0; "
            "retrying the phase once") in log
    line, _style = progress_line(event)
    assert line.startswith("out of device memory in VAE decode (vae): cache released, stepped down")
    assert "\n" not in line and "\n" not in log and "\x1b" not in log
    assert "(CUDA out of memory. Tried to allocate 2.00 GiB" in log  # the error's first line, escaped
