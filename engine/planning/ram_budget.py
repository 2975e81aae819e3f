"""`--ram-budget auto`: the host memory available at start, less a margin the plan shows.

"Available" is the kernel's estimate of what can be had without swapping (MemAvailable: free memory plus the page
cache and reclaimable slabs it can drop), read once before anything loads; what this process holds by then (the
interpreter, the imports) is not added back, since it stays. A cgroup memory limit (a container) caps it. The
margin, max(1.5 GB, 10 % of available), leaves room for other processes' growth, the reading's age and the
kernel's own working set: the page cache the file tiers read through must not be squeezed to nothing.
"""

from __future__ import annotations

from ...offload.units import format_bytes
from ..errors import ConfigError
from .auto_budget import Budget

AUTO_RAM_MARGIN_FRACTION = 0.10
AUTO_RAM_MIN_MARGIN = 1_500_000_000


def auto_ram_margin(available: int) -> int:
    return max(AUTO_RAM_MIN_MARGIN, int(AUTO_RAM_MARGIN_FRACTION * available))


def host_available() -> tuple[int, str]:
    """(bytes available now, how it was read): psutil's MemAvailable, capped by this process's cgroup limit."""
    import psutil

    from ...offload.telemetry_sources import read_cgroup_limit

    available = int(psutil.virtual_memory().available)
    how = "MemAvailable"
    try:
        limit = read_cgroup_limit()
    except OSError:
        limit = None
    if limit is not None and limit < available:
        available, how = limit, "the cgroup's memory limit"
    return available, how


def auto_ram_budget(flag: str = "--ram-budget auto", available: tuple[int, str] | None = None) -> Budget:
    """The host budget for `auto` (`available`: the reading, for tests; else `host_available()`)."""
    free, how = available if available is not None else host_available()
    margin = auto_ram_margin(free)
    if free - margin < 1:
        raise ConfigError(f"{flag}: only {format_bytes(free)} of host memory available ({how}), less than the "
                          f"{format_bytes(margin)} margin")
    note = (f"host budget auto: {format_bytes(free - margin)} = available at start {format_bytes(free)} ({how}) - "
            f"margin {format_bytes(margin)} ({AUTO_RAM_MARGIN_FRACTION * 100:g}% of available, at least "
            f"{format_bytes(AUTO_RAM_MIN_MARGIN)}: other processes' growth and the kernel's page cache)")
    return Budget(free - margin, note)
