"""How telemetry values read: decimal sizes, N/A with its reason, unavailable groups, report lines."""

from __future__ import annotations

from omni_console.console import telemetry_text as tt
from omni_console.offload.telemetry import HostMemory, NvmlMemory, TelemetrySnapshot, TorchMemory

GB = 10**9


def test_format_helpers():
    assert tt.format_bytes(23_800_000_000) == "23.8 GB"
    assert tt.format_bytes(None) == "N/A"
    assert tt.format_bytes(0) == "0 bytes"
    assert tt.format_rate(55_400_000_000) == "55.4 GB/s"
    assert tt.format_na("Not Supported") == "N/A (Not Supported)"
    assert tt.format_unavailable("no CUDA device") == "unavailable: no CUDA device"


def test_describe_snapshot_labels_every_group_and_names_missing_values():
    snap = TelemetrySnapshot(
        t=0.0,
        torch=TorchMemory(allocated=3 * GB, reserved=5 * GB, cached=2 * GB, device_name="Fake GPU",
                          errors={"peak": "boom"}),
        nvml=NvmlMemory(unavailable="NVML init failed: Driver Not Loaded"),
        host=HostMemory(rss=GB, pinned_bytes=0, total=8 * GB, available=4 * GB),
    )
    lines = tt.describe_snapshot(snap)
    assert lines[0] == "telemetry (GB = 10^9 bytes)"
    assert "torch [Fake GPU]:" in lines
    assert "  torch allocated (live tensors): 3.0 GB" in lines
    assert "  torch peak (max allocated since reset): N/A (boom)" in lines
    assert "NVML: unavailable: NVML init failed: Driver Not Loaded" in lines
    assert "free for us = NVML free + torch cached: N/A (NVML free: NVML init failed: Driver Not Loaded)" in lines
    assert "  pinned bytes held (engine): 0 bytes" in lines
