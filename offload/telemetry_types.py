"""Telemetry value types: what one sample of the torch allocator, NVML and host RAM holds.

Every group degrades instead of raising: a group that cannot be read at all carries
`unavailable` (the reason), a single failed query leaves its field `None` with the reason in
`errors[field]`. How these values read on screen lives in console/telemetry_text.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchMemory:
    """torch.cuda caching-allocator numbers for one device (bytes; `alloc_retries` is a count)."""

    allocated: int | None = None
    reserved: int | None = None
    cached: int | None = None
    peak: int | None = None
    alloc_retries: int | None = None
    free: int | None = None
    total: int | None = None
    device_name: str | None = None
    unavailable: str | None = None
    errors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class NvmlMemory:
    """NVML device numbers. `reserved` is driver/firmware memory (v2 API only), not torch's.

    PCIe rates are bytes per second; utilizations are percent. `memory_api` says which
    memory call answered ("v2", or "v1" on old drivers).
    """

    device_name: str | None = None
    total: int | None = None
    used: int | None = None
    free: int | None = None
    reserved: int | None = None
    pcie_rx_bytes_per_s: int | None = None
    pcie_tx_bytes_per_s: int | None = None
    nvlink_rx_bytes_per_s: int | None = None  # all links; from NVML's data counters between two samples
    nvlink_tx_bytes_per_s: int | None = None
    gpu_util_pct: int | None = None
    mem_util_pct: int | None = None
    memory_api: str | None = None
    process_used: int | None = None  # device bytes NVML counts for this process (None: not listed, see errors)
    unavailable: str | None = None
    errors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostMemory:
    """Host RAM. `total`/`available` are capped by the cgroup limit when one is set.

    `host_total` is the machine's RAM regardless of the cgroup, for the "(host has X)" note.
    """

    rss: int | None = None
    pinned_bytes: int | None = None
    total: int | None = None
    available: int | None = None
    cgroup_limit: int | None = None
    host_total: int | None = None
    unavailable: str | None = None
    errors: Mapping[str, str] = field(default_factory=dict)


NO_SOURCE = "no source configured"

DEFAULT_HZ = 10.0
"""The telemetry rate when none is given: `--telemetry-hz`, the app and the sampler all default to it.
Here, not in telemetry.py, so the CLI can name it without importing the sampler."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TelemetrySnapshot:
    """One sample of every group; `t` is `time.monotonic()` (comparable with event times)."""

    t: float
    torch: TorchMemory = field(default_factory=lambda: TorchMemory(unavailable=NO_SOURCE))
    nvml: NvmlMemory = field(default_factory=lambda: NvmlMemory(unavailable=NO_SOURCE))
    host: HostMemory = field(default_factory=lambda: HostMemory(unavailable=NO_SOURCE))

    @property
    def free_for_us(self) -> int | None:
        """Device memory this process could still get: NVML free + torch cached.

        Falls back to cudaMemGetInfo's free (also device-wide) when NVML cannot say; None
        when either term is unknown.
        """
        free = self.nvml.free if self.nvml.free is not None else self.torch.free
        cached = self.torch.cached
        if free is None or cached is None:
            return None
        return free + cached

    @property
    def free_for_us_source(self) -> str:
        """Which free figure `free_for_us` used ("NVML", "mem_get_info" or "")."""
        if self.torch.cached is None:
            return ""
        if self.nvml.free is not None:
            return "NVML"
        return "mem_get_info" if self.torch.free is not None else ""


class Source(Protocol):
    """Anything with a `read()` that returns one group (and never raises)."""

    def read(self) -> TorchMemory | NvmlMemory | HostMemory: ...


def reason_of(exc: BaseException) -> str:
    """A short human reason for an exception (NVMLError's str is its NVML error text)."""
    text = str(exc).strip()
    return text or type(exc).__name__

