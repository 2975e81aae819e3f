"""Byte and rate formatting shared by every view: decimal units (1 GB = 10^9 bytes), as `nvidia-smi`
and link bandwidth figures use."""

from __future__ import annotations

from rich.filesize import decimal


def fmt_bytes(n: int | float | None) -> str:
    """`23.8 GB`; `N/A` for None."""
    if n is None:
        return "N/A"
    if n < 0:
        return "-" + decimal(int(-n))
    return decimal(int(n))


def fmt_rate(bytes_per_s: float | None) -> str:
    """`55.4 GB/s`."""
    return "N/A" if bytes_per_s is None else f"{bytes_per_s / 1e9:.1f} GB/s"


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "N/A"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"
