"""How every view writes sizes, rates and durations: decimal units (1 GB = 10^9 bytes), as
`nvidia-smi`, PCIe link bandwidths and the project's benchmark reports do."""

from __future__ import annotations

from rich import filesize

NA = "N/A"


def format_bytes(n: int | float | None) -> str:
    """`23.8 GB`; None → `N/A`."""
    if n is None:
        return NA
    if n < 0:
        return "-" + filesize.decimal(int(-n))
    return filesize.decimal(int(n))


def format_rate(bytes_per_s: int | float | None) -> str:
    """`55.4 GB/s`; None → `N/A`."""
    if bytes_per_s is None:
        return NA
    return format_bytes(bytes_per_s) + "/s"


def format_seconds(s: float | None) -> str:
    """`12.3 ms` below a second, `1.23 s` above; None → `N/A`."""
    if s is None:
        return NA
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


ALIGNMENT = 256
"""Byte alignment of every packed tensor (host arena regions, device slots): keeps device views
friendly to vectorized kernels. Here, without torch, so the planner can size slots cheaply."""


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    return -(-n // alignment) * alignment
