"""The device probes a face asks for: the machine's device and host memory (`read_device_info`, read once
at startup, cheap, no allocation; live figures come from telemetry), the host→device link's rate
(`measure_h2d_bandwidth`), and the runtime's import as its own start-up step (`import_runtime`).

They live below the console so that no console module imports torch (an import-linter contract).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..offload.pinned import HostArena
from ..offload.units import format_bytes

MEASURE_BYTES = 256 * 1024 * 1024
REPEATS = 4


def import_runtime() -> None:
    """Import torch now (the console shows it as a start-up step: the longest one on a small machine);
    importing this module already did."""


def measure_h2d_bandwidth(device: torch.device, nbytes: int = MEASURE_BYTES) -> float | None:
    """Bytes per second of one pinned host→device copy of `nbytes`; None on CPU.

    Copied the way the streamer copies (asynchronously, from page-locked memory), the best of several
    copies after a full-size warm-up: a single first copy pays for mapping the buffer and reads about a
    third of the link's rate. Run it on the engine's worker so a UI never waits on it.

    The buffer is page-locked in place (`HostArena`, as the streamer's) and unlocked and freed after: PyTorch's
    `pin_memory=True` allocator would keep it cached for the process's life, host memory no forecast names."""
    if device.type != "cuda":
        return None
    arena = HostArena(nbytes, pin=True)
    host = arena.tensor
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    try:
        dev.copy_(host, non_blocking=True)  # warm-up at full size: context, copy engine, page mapping
        torch.cuda.synchronize(device)
        seconds = float("inf")
        for _ in range(REPEATS):
            start = time.perf_counter()
            dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize(device)
            seconds = min(seconds, time.perf_counter() - start)
    finally:
        torch.cuda.synchronize(device)  # no copy may still read the buffer when it is unlocked
        del host, dev
        arena.close()
        torch.cuda.empty_cache()
    return nbytes / seconds if seconds > 0 and arena.pin_failure_reason is None else None


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
