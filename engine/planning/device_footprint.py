"""A budget is the device memory of the process, as NVML counts it per process; this is what lies outside torch.

NVML's per-process figure = the CUDA context (driver state, loaded kernel images, cuBLAS/cuDNN
handles) + the caching allocator's reserved bytes (allocated + cached + fragmentation). The
planner forecasts torch's *allocated* peak, so a budget that is the card's size must leave room for
the rest. Measured on an H200 (driver 580, torch 2.11), NVML per process minus torch reserved at a
request's end: 0.79 GB in every real-card run (Flux-size and Wan-14B-size, 8 to 24 GB cards). The
default (nothing measured yet) is 1.0 GB: above that, so a first plan errs on the safe side, and close
enough that the first forecast stays within 10 % of the card's figure.

`DeviceOverhead` = context bytes (measured on this device, driver and torch when a request has run
here: NVML per-process used minus torch reserved, cached like the request profiles and read back
as untrusted input; else `DEFAULT_CONTEXT_BYTES`, said so) + a fragmentation margin inside the
allocator's share. The planner fits allocated peak + overhead <= budget; the allocator is capped at
budget - context (`allocator_bound.py`), so the margin is the fragmentation room under that cap.
Torch-free: `plan` reads it without importing torch.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

from ...offload.units import format_bytes
from ..cache_dir import CacheFileError, cache_root, read_cache_file, write_cache_file

DEFAULT_CONTEXT_BYTES = 1_000_000_000  # H200, torch 2.11: 0.79 GB measured in every real-card run (module docstring)
MARGIN_FRACTION = 0.03  # fragmentation inside the allocator's cap (expandable segments keep it small)
MIN_MARGIN_BYTES = 256_000_000
MAX_CONTEXT_BYTES = 64 * 10**9  # a cached figure above this is not a context: ignored
MAX_FILE_BYTES = 4096
FOOTPRINT_VERSION = 1

ContextSource = Literal["measured", "default", "none"]


def margin_for(allocated: int) -> int:
    """The fragmentation margin for an allocated peak (a fraction of it, at least `MIN_MARGIN_BYTES`)."""
    return max(MIN_MARGIN_BYTES, int(MARGIN_FRACTION * allocated))


@dataclass(frozen=True, slots=True)
class DeviceOverhead:
    """The process's device memory outside torch's allocated bytes, and where the context figure came from."""

    context_bytes: int
    context_source: ContextSource
    device: str = "cpu"
    note: str = ""  # why a cached figure was not used, if one was not

    def margin(self, allocated: int) -> int:
        return 0 if self.context_source == "none" else margin_for(allocated)

    def process_bytes(self, allocated_peak: int, slack: int | None = None, budget: int | None = None) -> int:
        """The predicted device memory of the process for an allocated peak. `slack`: the allocator's
        reserved-above-allocated measured by a request of this size under this plan (it replaces the margin
        when larger); `budget`: the allocator is capped at budget - context, so the process stays inside it."""
        if self.context_source == "none":
            return allocated_peak
        process = allocated_peak + self.context_bytes + max(self.margin(allocated_peak), slack or 0)
        return process if budget is None else min(process, max(budget, allocated_peak + self.context_bytes))

    def allocated_budget(self, budget: int) -> int:
        """The largest allocated peak whose process figure fits `budget` (negative: nothing fits)."""
        if self.context_source == "none":
            return budget
        room = budget - self.context_bytes
        return min(room - MIN_MARGIN_BYTES, int(room / (1 + MARGIN_FRACTION)))

    def allocator_cap(self, budget: int) -> int:
        """What the caching allocator may reserve (allocated + cache + fragmentation) within `budget`."""
        return budget - self.context_bytes

    def describe(self, allocated: int | None = None, slack: int | None = None) -> str:
        if self.context_source == "none":
            return "no device context (cpu)"
        where = ("measured on this device" if self.context_source == "measured"
                 else "default: nothing measured yet on this device, driver and torch")
        context = f"CUDA context {format_bytes(self.context_bytes)} ({where})"
        if allocated is not None and slack is not None and slack > self.margin(allocated):
            return (f"{context} + allocator cache {format_bytes(slack)} (reserved above allocated, measured by "
                    f"a request of this size under this plan)")
        margin = (format_bytes(self.margin(allocated)) if allocated is not None
                  else f"{MARGIN_FRACTION * 100:g}% of the allocated peak, at least {format_bytes(MIN_MARGIN_BYTES)}")
        return f"{context} + allocator margin {margin}"


NO_OVERHEAD = DeviceOverhead(0, "none")


def _versions() -> tuple[str, str]:
    """(torch's version, the NVIDIA driver's) without importing torch or initialising CUDA; "" if unknown."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = ""
    driver = ""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            raw = pynvml.nvmlSystemGetDriverVersion()
            driver = raw.decode() if isinstance(raw, bytes) else str(raw)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver or no library: the key simply has none
        driver = ""
    return torch_version, driver


def footprint_path(device: str, torch_version: str, driver: str) -> Path:
    key = json.dumps([FOOTPRINT_VERSION, device, torch_version, driver])
    return cache_root() / "footprint" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def read_context(path: Path) -> int | None:
    """The cached context bytes; None when absent; `CacheFileError` when the file cannot be used."""
    raw = read_cache_file(path, MAX_FILE_BYTES)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise CacheFileError("is not JSON") from None
    value = doc.get("context_bytes") if isinstance(doc, dict) else None
    if type(value) is not int or not 0 <= value <= MAX_CONTEXT_BYTES:
        raise CacheFileError("has no context_bytes in range")
    return value


def device_overhead(device: str) -> DeviceOverhead:
    """The overhead on `device` (a profile key's device name: "cpu" or the GPU's name)."""
    if device == "cpu":
        return NO_OVERHEAD
    path = footprint_path(device, *_versions())
    note = ""
    try:
        measured = read_context(path)
    except CacheFileError as exc:
        measured, note = None, f"cached device footprint {path.name} ignored: {exc}"
    if measured is not None:
        return DeviceOverhead(measured, "measured", device)
    return DeviceOverhead(DEFAULT_CONTEXT_BYTES, "default", device, note)


def record_context(device: str, context_bytes: int) -> Path | None:
    """Cache a measured context (the largest seen here: kernels load lazily, so it only grows);
    None when the figure is not plausible. Written whole (temp file, then replace)."""
    if device == "cpu" or not 0 < context_bytes <= MAX_CONTEXT_BYTES or not math.isfinite(context_bytes):
        return None
    path = footprint_path(device, *_versions())
    try:
        previous = read_context(path) or 0
    except CacheFileError:
        previous = 0
    if previous >= context_bytes:
        return path
    document = {"version": FOOTPRINT_VERSION, "device": device, "context_bytes": int(context_bytes)}
    return write_cache_file(path, json.dumps(document), ".footprint-")
