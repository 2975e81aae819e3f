"""How telemetry reads: panel labels, value texts, N/A reasons and the plain-text report.

The console panels and the headless report render the same values with the same labels, so
both take them from here. Sizes are decimal: 1 GB = 10^9 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..engine.api import TelemetrySnapshot, probes
from ..offload.units import NA, format_bytes, format_rate

UNITS_NOTE = "GB = 10^9 bytes"

LABELS: dict[str, str] = {
    "torch.allocated": "torch allocated (live tensors)",
    "torch.reserved": "torch reserved (caching allocator)",
    "torch.cached": "cached = reserved − allocated",
    "torch.peak": "torch peak (max allocated since reset)",
    "torch.alloc_retries": "torch alloc retries (flush + retry)",
    "torch.free": "mem_get_info free (device-wide)",
    "torch.total": "mem_get_info total",
    "nvml.total": "NVML total",
    "nvml.used": "NVML used (all processes + context)",
    "nvml.free": "NVML free",
    "nvml.reserved": "NVML reserved (driver/firmware)",
    "nvml.pcie_rx": "NVML PCIe RX (host→GPU)",
    "nvml.pcie_tx": "NVML PCIe TX (GPU→host)",
    "nvml.gpu_util": "NVML GPU util",
    "nvml.mem_util": "NVML mem util (bandwidth busy, not capacity)",
    "free_for_us": "free for us = NVML free + torch cached",
    "host.rss": "process RSS",
    "host.pinned": "pinned bytes held (engine)",
    "host.total": "RAM total",
    "host.available": "RAM available",
}



def format_na(reason: str | None) -> str:
    """How a missing value reads: "N/A (reason)" or plain "N/A"."""
    return f"{NA} ({reason})" if reason else NA


def format_unavailable(reason: str) -> str:
    """How a missing group reads, e.g. "unavailable: no CUDA device"."""
    return f"unavailable: {reason}"


@dataclass(frozen=True, slots=True)
class Reading:
    """One labelled number of a snapshot: the raw value (for plots), its text, its N/A reason."""

    key: str
    label: str
    value: float | None
    text: str
    reason: str | None = None


def reading_text(r: Reading) -> str:
    """The value text, or "N/A (reason)" when the value is missing."""
    return r.text if r.value is not None else format_na(r.reason)


def _reading(key: str, value: int | float | None, text: str, group: Any, field_name: str) -> Reading:
    reason = None
    if value is None:
        reason = group.unavailable or group.errors.get(field_name) or "not reported"
    return Reading(key, LABELS[key], None if value is None else float(value), text, reason)


def torch_readings(m: probes.TorchMemory) -> list[Reading]:
    """The torch allocator rows, in display order."""
    rows = [
        ("torch.allocated", "allocated", m.allocated, format_bytes(m.allocated)),
        ("torch.reserved", "reserved", m.reserved, format_bytes(m.reserved)),
        ("torch.cached", "cached", m.cached, format_bytes(m.cached)),
        ("torch.peak", "peak", m.peak, format_bytes(m.peak)),
        (
            "torch.alloc_retries",
            "alloc_retries",
            m.alloc_retries,
            NA if m.alloc_retries is None else str(m.alloc_retries),
        ),
        ("torch.free", "free", m.free, format_bytes(m.free)),
    ]
    return [_reading(k, v, t, m, f) for k, f, v, t in rows]


def nvml_readings(m: probes.NvmlMemory) -> list[Reading]:
    """The NVML rows, in display order."""
    pct = [NA if v is None else f"{v} %" for v in (m.gpu_util_pct, m.mem_util_pct)]
    rows = [
        ("nvml.total", "total", m.total, format_bytes(m.total)),
        ("nvml.used", "used", m.used, format_bytes(m.used)),
        ("nvml.free", "free", m.free, format_bytes(m.free)),
        ("nvml.reserved", "reserved", m.reserved, format_bytes(m.reserved)),
        ("nvml.pcie_rx", "pcie_rx", m.pcie_rx_bytes_per_s, format_rate(m.pcie_rx_bytes_per_s)),
        ("nvml.pcie_tx", "pcie_tx", m.pcie_tx_bytes_per_s, format_rate(m.pcie_tx_bytes_per_s)),
        ("nvml.gpu_util", "gpu_util", m.gpu_util_pct, pct[0]),
        ("nvml.mem_util", "mem_util", m.mem_util_pct, pct[1]),
    ]
    return [_reading(k, v, t, m, f) for k, f, v, t in rows]


def free_for_us_reading(s: TelemetrySnapshot) -> Reading:
    """The free-for-us row; its reason names the missing term."""
    value = s.free_for_us
    reason = None
    if value is None:
        if s.torch.cached is None:
            reason = "torch cached: " + (s.torch.unavailable or s.torch.errors.get("cached", "not reported"))
        else:
            reason = "NVML free: " + (s.nvml.unavailable or s.nvml.errors.get("free", "not reported"))
    text = format_bytes(value)
    if value is not None and s.free_for_us_source == "mem_get_info":
        text += " (mem_get_info free; NVML N/A)"
    as_float = None if value is None else float(value)
    return Reading("free_for_us", LABELS["free_for_us"], as_float, text, reason)


def host_readings(m: probes.HostMemory) -> list[Reading]:
    """The host rows, in display order; a cgroup limit is noted on the total."""
    total_text = format_bytes(m.total)
    if m.cgroup_limit is not None and m.total is not None:
        total_text += f" (cgroup limit; host has {format_bytes(m.host_total)})"
    rows = [
        ("host.rss", "rss", m.rss, format_bytes(m.rss)),
        ("host.pinned", "pinned_bytes", m.pinned_bytes, format_bytes(m.pinned_bytes)),
        ("host.total", "total", m.total, total_text),
        ("host.available", "available", m.available, format_bytes(m.available)),
    ]
    return [_reading(k, v, t, m, f) for k, f, v, t in rows]


def describe_snapshot(s: TelemetrySnapshot) -> list[str]:
    """Plain-text report lines of a snapshot (headless `--once` style output)."""
    lines: list[str] = [f"telemetry ({UNITS_NOTE})"]
    torch_title = "torch" + (f" [{s.torch.device_name}]" if s.torch.device_name else "")
    nvml_title = "NVML" + (f" [{s.nvml.device_name}]" if s.nvml.device_name else "")
    groups: list[tuple[str, Any, list[Reading]]] = [
        (torch_title, s.torch, torch_readings(s.torch)),
        (nvml_title, s.nvml, nvml_readings(s.nvml)),
    ]
    for title, group, readings in groups:
        if group.unavailable:
            lines.append(f"{title}: {format_unavailable(group.unavailable)}")
            continue
        lines.append(f"{title}:")
        lines += [f"  {r.label}: {reading_text(r)}" for r in readings]
    ffu = free_for_us_reading(s)
    lines.append(f"{ffu.label}: {reading_text(ffu)}")
    if s.host.unavailable:
        lines.append(f"host: {format_unavailable(s.host.unavailable)}")
    else:
        lines.append("host:")
        lines += [f"  {r.label}: {reading_text(r)}" for r in host_readings(s.host)]
    return lines
