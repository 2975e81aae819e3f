"""The kernel's memory figures for this process (/proc/self/status), without torch: the planner reads the
measured peak RSS it learns from, and imports no torch (a plan without a size loads none)."""

from __future__ import annotations

from pathlib import Path


def status_bytes(key: str, status: Path = Path("/proc/self/status")) -> int | None:
    """One of the kernel's memory figures for this process (VmRSS, VmHWM, ...) in bytes; None where it does not say."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
