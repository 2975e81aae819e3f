"""Telemetry against a real GPU and the real NVML library (run with `pytest -m cuda`)."""

from __future__ import annotations

import pytest
import torch

from omni_console.offload.events import EventBus, TelemetryEvent
from omni_console.offload.pinned import HostArena
from omni_console.offload.telemetry import TelemetrySampler, default_sources

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_real_sources_report_the_gpu_the_allocator_and_pinned_bytes():
    sources = default_sources("cuda:0")
    bus = EventBus()
    sub = bus.subscribe()
    sampler = TelemetrySampler(*sources, bus=bus, hz=10)
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    arena = HostArena(64 * 2**20 + 123, pin=True)
    try:
        snap = sampler.sample_now(publish=True)
    finally:
        arena.close()
        sampler.close()
    assert snap.torch.unavailable is None and snap.nvml.unavailable is None, (snap.torch, snap.nvml)
    assert snap.torch.allocated >= block.numel() and snap.torch.reserved >= snap.torch.allocated
    assert snap.torch.cached == snap.torch.reserved - snap.torch.allocated
    assert snap.torch.total == torch.cuda.get_device_properties(0).total_memory
    assert "H200" in (snap.nvml.device_name or "") or snap.nvml.device_name
    assert snap.nvml.total and snap.nvml.used and snap.nvml.free is not None
    assert snap.nvml.used >= snap.torch.reserved  # NVML used counts our reservation plus the context
    assert snap.host.pinned_bytes >= 64 * 2**20 + 123
    assert snap.free_for_us == snap.nvml.free + snap.torch.cached
    assert any(isinstance(e, TelemetryEvent) for e in sub.drain())
    print(f"\nNVML {snap.nvml.memory_api}: used {snap.nvml.used} reserved {snap.nvml.reserved} "
          f"PCIe rx {snap.nvml.pcie_rx_bytes_per_s}; torch reserved {snap.torch.reserved}")
    del block
