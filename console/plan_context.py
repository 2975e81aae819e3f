"""The machine side of the plan screen: the device link the forecast is judged against, and the header.

No Textual here. Both read the newest telemetry sample when there is one (free memory moves while
the operator edits the policy) and fall back to what was read at startup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..engine.api import ModelInfo, TelemetrySnapshot

if TYPE_CHECKING:  # the probe's module imports torch; the plan screen's text needs only the value
    from ..engine.api import probes
from ..offload.units import format_bytes


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """The device side the forecast is judged against."""

    is_cuda: bool
    bandwidth: float | None = None  # bytes/s host→device
    bandwidth_source: str = ""
    free_bytes: int | None = None
    free_source: str = ""
    live_replan: bool = False  # the engine loads with every master kept (host memory = whole model)


def link_info(device: probes.DeviceInfo, snapshot: TelemetrySnapshot | None, bandwidth: float | None,
              bandwidth_source: str, observed_rate: float | None, live_replan: bool = False) -> LinkInfo:
    """Bandwidth (given or measured, else the mean of observed copies) and the best free-memory figure."""
    if not device.is_cuda:
        return LinkInfo(is_cuda=False, live_replan=live_replan)
    if bandwidth is None and observed_rate is not None:
        bandwidth, bandwidth_source = observed_rate, "mean of observed staging copies"
    free, free_source = None, ""
    if snapshot is not None and snapshot.free_for_us is not None:
        free, free_source = snapshot.free_for_us, "free for us = NVML free + torch cached"
    elif snapshot is not None and snapshot.torch.free is not None:
        free, free_source = snapshot.torch.free, "cudaMemGetInfo free"
    elif device.free_bytes is not None:
        free, free_source = device.free_bytes, "cudaMemGetInfo free at startup"
    return LinkInfo(True, bandwidth, bandwidth_source, free, free_source, live_replan)


def header_text(model: ModelInfo, device: probes.DeviceInfo, snapshot: TelemetrySnapshot | None,
                host_peak: int | None = None) -> str:
    """Two lines: the model (path, pipeline, weight bytes), then the device and host memory; `host_peak`:
    the host forecast's peak RSS, shown next to the RAM it must fit in."""
    described = device.describe()
    host = device.describe_host()
    if device.is_cuda and snapshot is not None and snapshot.torch.free is not None:
        described = (f"{device.device} {device.name} · {format_bytes(device.total_bytes)} "
                     f"({format_bytes(snapshot.torch.free)} free)")
    if snapshot is not None and snapshot.host.available is not None and snapshot.host.total is not None:
        host = f"host RAM {format_bytes(snapshot.host.total)} ({format_bytes(snapshot.host.available)} available)"
    if host_peak is not None:
        host += f" · needs {format_bytes(host_peak)}"
    return (f"model {model.path} · {model.pipeline_class} · {format_bytes(model.nbytes)} of weights\n"
            f"device {described} · {host}")
