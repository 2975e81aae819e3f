"""The process's device memory as NVML counts it: its peak during a request, its part outside torch, the cap.

A budget is the card's memory: the CUDA context, the caching allocator's reserved bytes and all
the rest (engine/planning/device_footprint.py). Three pieces here:
- `ProcessPeakMeter`: a thread sampling NVML's per-process figure (nvmlDeviceGetComputeRunningProcesses)
  during a request, keeping the largest; what `run` reports as the measured device memory of the process.
- `context_bytes`: NVML's per-process figure minus torch's reserved bytes, i.e. what lies outside the
  allocator (cached by the engine so the next plan counts the measured figure instead of a default).
- `bound_allocator`: `torch.cuda.set_per_process_memory_fraction` set so that the caching allocator
  never reserves more than the plan gave it (budget minus context): past it, torch frees its cache
  and retries before it raises an out-of-memory error, which the engine's OOM guard then handles.

And one piece of the host: `release_freed_heap` hands the C heap's free pages back to the kernel
(glibc's `malloc_trim`) once a load or a request has freed its transients.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch


class ProcessSource(Protocol):
    def process_used(self, pid: int | None = None) -> tuple[int | None, str | None]: ...


@dataclass(frozen=True, slots=True)
class ProcessPeak:
    peak_bytes: int | None  # None: never read (the reason says why)
    samples: int
    reason: str | None = None


class ProcessPeakMeter:
    """Samples the process's NVML figure every `interval` seconds on a daemon thread; `stop()` returns the peak."""

    def __init__(self, source: ProcessSource, interval: float = 0.05) -> None:
        self._source, self._interval = source, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak: int | None = None
        self.samples = 0
        self.reason: str | None = None

    def sample(self) -> None:
        used, why = self._source.process_used()
        if used is None:
            self.reason = why
            return
        self.samples += 1
        self.peak = used if self.peak is None else max(self.peak, used)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self._interval)

    def start(self) -> ProcessPeakMeter:
        self._thread = threading.Thread(target=self._run, name="process-peak", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> ProcessPeak:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample()
        return ProcessPeak(self.peak, self.samples, None if self.peak is not None else self.reason)


def context_bytes(device: torch.device, source: ProcessSource) -> int | None:
    """The process's device bytes outside torch's allocator now (None: NVML cannot say)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    used, _ = source.process_used()
    if used is None:
        return None
    return max(used - torch.cuda.memory_reserved(device), 0)


def bound_allocator(device: torch.device, cap_bytes: int | None) -> float | None:
    """Cap the caching allocator's reserved bytes at `cap_bytes` (None: lift the cap); the fraction set.

    The fraction is of the device's total memory as CUDA reports it (a whole H200 under a ballast
    too, so the cap is in bytes whatever else runs there)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()  # torch wants an index
    _, total = torch.cuda.mem_get_info(index)
    fraction = 1.0 if cap_bytes is None else min(max(cap_bytes / total, 0.0), 1.0)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction


def _libc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None) if libc is not None else None  # glibc only (musl has none)


_TRIM = _libc_trim()


def release_freed_heap() -> bool:
    """Give the C heap's free pages back to the kernel; False where there is no glibc to ask.

    Why: glibc keeps freed memory for reuse. Once a freed block of up to 32 MiB raised its mmap threshold,
    host tensors of that size come from the heap, and what a load frees between the blocks that stay (read
    buffers, a component's host copy before it moved to the device, in the load's own threads' arenas) stays
    resident: the process's RSS then exceeds what it holds by that much (benchmarks/process_rss.py measures
    it; a CPU sketch: 300 MB of freed 3 MB tensors stayed resident until `malloc_trim(0)` released them).
    `malloc_trim(0)` releases the free pages of every arena, including those between live blocks. Called per
    resident block during a load, so it measures nothing itself (the benchmark reads RSS around it)."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
