"""What the plan screen's header says about the machine: device name and memory, host RAM.

Read once at startup (cheap, no allocation); live free-memory figures come from telemetry.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..offload.units import format_bytes


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """The compute device and the host, as far as they can be read."""

    device: str
    name: str
    total_bytes: int | None = None
    free_bytes: int | None = None
    host_total_bytes: int | None = None
    host_available_bytes: int | None = None

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def describe(self) -> str:
        """`cuda:0 NVIDIA H200 · 150.0 GB (139.2 GB free)` or `CPU`."""
        if not self.is_cuda:
            return "CPU (no GPU: weights and compute in host RAM)"
        mem = format_bytes(self.total_bytes)
        if self.free_bytes is not None:
            mem += f" ({format_bytes(self.free_bytes)} free)"
        return f"{self.device} {self.name} · {mem}"

    def describe_host(self) -> str:
        if self.host_total_bytes is None:
            return "host RAM N/A"
        available = self.host_available_bytes
        avail = f" ({format_bytes(available)} available)" if available is not None else ""
        return f"host RAM {format_bytes(self.host_total_bytes)}{avail}"


def read_device_info(device: torch.device) -> DeviceInfo:
    """Name and memory of `device` (CUDA: cudaMemGetInfo) and the host's RAM (psutil)."""
    host_total = host_avail = None
    try:
        import psutil

        vm = psutil.virtual_memory()
        host_total, host_avail = int(vm.total), int(vm.available)
    except Exception:  # psutil missing or failing: the header says N/A
        pass
    if device.type != "cuda":
        return DeviceInfo(str(device), "CPU", host_total_bytes=host_total, host_available_bytes=host_avail)
    index = device.index if device.index is not None else torch.cuda.current_device()
    name, free, total = "CUDA device", None, None
    try:
        name = torch.cuda.get_device_name(index)
        free, total = (int(x) for x in torch.cuda.mem_get_info(index))
    except Exception:
        pass
    return DeviceInfo(f"cuda:{index}", name, total, free, host_total, host_avail)
