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


STREAMED_NAME = "streamed per {kind} forward"
"""The one name of the streamed blocks' weight bytes (plan table, plan panel, run report): each such
block crosses the link once per forward of its DiT/UNet, and a step may run several forwards (CFG)."""

STREAMED_DESCRIPTION = ("weight bytes of the streamed blocks: each crosses the host->device link once per "
                        "DiT/UNet forward (a step runs one or more forwards); the copies move these bytes plus "
                        "the packed layout's padding (run report: copied_bytes_per_forward)")

COPIED_DESCRIPTION = ("bytes one forward's copies move: streamed_bytes_per_forward (the weights) plus the padding "
                      "of the packed block regions (256-byte alignment; on a CPU each tensor also keeps its file's "
                      "offset within a page)")


def copied_text(copied: int, weights: int) -> str:
    """`2.5 MB (2.2 MB of weights + 314.6 kB padding)`: the copied bytes, never unlabelled against the
    weights they carry (the plan names only the weights)."""
    if copied <= weights:
        return format_bytes(copied)
    return f"{format_bytes(copied)} ({format_bytes(weights)} of weights + {format_bytes(copied - weights)} padding)"
