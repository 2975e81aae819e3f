"""What a face asks of the machine (no console module imports torch): probes, memory setup, telemetry.

One namespace of the engine's front door (`from omni_console.engine.api import probes`); names load lazily.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports are this namespace's names, for type checkers)
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:  # the same names as `EXPORTS` (tests/engine/test_api.py holds them equal)
    from ...offload.nvml_source import NvmlSource, nvml_target_for
    from ...offload.process_memory import ProcessPeakMeter, bound_allocator, context_bytes
    from ...offload.telemetry import TelemetrySampler, default_sources, validate_hz
    from ...offload.telemetry_types import DEFAULT_HZ, HostMemory, NvmlMemory, Source, TorchMemory
    from ..device_probes import DeviceInfo, import_runtime, measure_h2d_bandwidth, read_device_info
    from ..engine import default_device
    from ..loading.bus_error import install_bus_error_line
    from ..loading.device_choice import parse_device
    from ..running.run_memory import RunMemory, prefer_expandable_segments, step_down_docs

EXPORTS: dict[str, tuple[str, ...]] = {
    "..device_probes": ("DeviceInfo", "import_runtime", "measure_h2d_bandwidth", "read_device_info"),
    "..engine": ("default_device",),
    "..loading.device_choice": ("parse_device",),
    "..loading.bus_error": ("install_bus_error_line",),
    "..running.run_memory": ("RunMemory", "prefer_expandable_segments", "step_down_docs"),
    "...offload.telemetry": ("TelemetrySampler", "default_sources", "validate_hz"),
    "...offload.telemetry_types": ("DEFAULT_HZ", "HostMemory", "NvmlMemory", "Source", "TorchMemory"),
    "...offload.nvml_source": ("NvmlSource", "nvml_target_for"),
    "...offload.process_memory": ("ProcessPeakMeter", "bound_allocator", "context_bytes"),
}
"""Each name's module (relative to this package)."""

__getattr__, __dir__, __all__ = lazy_names(__name__, __package__, EXPORTS)
