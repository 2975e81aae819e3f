"""`run`'s device memory of the process: the forecast's figure next to NVML's, the allocator setting left to
an operator who chose one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from omni_console.engine.planning.device_footprint import DeviceOverhead, margin_for
from omni_console.engine.running.run_memory import ALLOC_CONF, RunMemory, prefer_expandable_segments

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


class _Meter:
    def __init__(self, peak: int | None) -> None:
        self.peak = peak

    def stop(self):
        from omni_console.offload.process_memory import ProcessPeak

        return ProcessPeak(self.peak, 3)


class _Source:
    def close(self) -> None:
        pass


@pytest.mark.parametrize(("allocated", "reserved", "expected", "note"), [
    (int(9.5 * GB), None, int(10.5 * GB), "allocated"),  # reserved unknown: allocated is the floor
    (int(8.5 * GB), int(9.25 * GB), int(10.25 * GB), "reserved"),  # the cache above allocated counts (NVML sees it)
    (8 * GB, int(8.5 * GB), 10 * GB, None)])  # the samples saw more: they stand
def test_the_process_peak_is_at_least_the_context_plus_torchs_peak_when_samples_missed_it(
        monkeypatch: pytest.MonkeyPatch, allocated: int, reserved: int | None, expected: int, note: str | None):
    from omni_console.engine.running import run_memory

    monkeypatch.setattr(run_memory, "context_bytes", lambda device, source: GB)
    monkeypatch.setattr(run_memory, "record_context", lambda device, context: None)
    memory = RunMemory(torch.device("cuda"), "GPU", meter=_Meter(10 * GB), source=_Source())  # type: ignore[arg-type]
    doc = memory.finish(allocated, reserved)
    assert doc["process_peak_bytes"] == expected and doc["process_peak_sampled_bytes"] == 10 * GB
    if note is None:
        assert "missed a shorter peak" not in (doc["process_peak_note"] or "")
    else:
        assert f"torch's {note} peak (the 50 ms NVML samples missed a shorter peak)" in doc["process_peak_note"]
