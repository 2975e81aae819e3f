"""The process's device memory as NVML counts it: found by PID, its peak sampled, its reason when absent."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from omni_console.offload.nvml_source import NvmlSource, nvml_target_for
from omni_console.offload.process_memory import ProcessPeakMeter, bound_allocator, context_bytes


class FakeNvml:
    """Two processes on one GPU: a ballast and this one, whose figure the test moves."""

    def __init__(self) -> None:
        self.ours = 3_000_000_000

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return object()

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=1, usedGpuMemory=130_000_000_000),
                SimpleNamespace(pid=os.getpid(), usedGpuMemory=self.ours)]


def test_this_process_is_found_by_pid_and_another_pid_is_a_reason():
    source = NvmlSource(0, nvml=FakeNvml())  # type: ignore[arg-type]
    assert source.process_used() == (3_000_000_000, None)
    assert source.process_used(1) == (130_000_000_000, None)
    used, why = source.process_used(424242)
    assert used is None and "not in NVML's list (2 listed" in why


def test_the_meter_keeps_the_largest_sample():
    nvml = FakeNvml()
    meter = ProcessPeakMeter(NvmlSource(0, nvml=nvml))  # type: ignore[arg-type]
    meter.sample()
    nvml.ours = 9_000_000_000
    meter.sample()
    nvml.ours = 4_000_000_000
    peak = meter.stop()
    assert peak.peak_bytes == 9_000_000_000 and peak.samples == 3 and peak.reason is None


def test_without_nvml_the_peak_is_none_with_the_reason():
    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise RuntimeError("driver not loaded")

    peak = ProcessPeakMeter(NvmlSource(0, nvml=Broken())).stop()  # type: ignore[arg-type]
    assert peak.peak_bytes is None and "NVML init failed: driver not loaded" in peak.reason


def test_a_cpu_has_no_cap_and_no_context():
    assert bound_allocator(torch.device("cpu"), 10**9) is None
    assert context_bytes(torch.device("cpu"), NvmlSource(0, nvml=FakeNvml())) is None  # type: ignore[arg-type]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cap_stops_the_allocator_at_its_bytes_and_nvml_sees_this_process():
    device = torch.device("cuda")
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved(device)
    bound_allocator(device, base + 2 * 2**30)
    try:
        keep = torch.empty(2**30, dtype=torch.uint8, device=device)
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(2 * 2**30, dtype=torch.uint8, device=device)
        del keep
    finally:
        bound_allocator(device, None)
        torch.cuda.empty_cache()
    used, why = NvmlSource(nvml_target_for(torch.cuda.current_device())).process_used()
    assert (used is not None and used > torch.cuda.memory_reserved(device)) or "PID namespace" in (why or "")
