"""`run --gpus N`'s report as a table: one row per rank, then the wall time and the files written."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..engine.api import plain
from ..offload.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from ..engine.api import service


def print_ranks_report(r: service.RanksReport, console: Console) -> None:
    table = Table(title=Text(plain(f"run — {r.model} on {r.gpus} ranks ({r.device})")), caption=Text(plain(r.layout)))
    for column in ("rank", "seed", "load", "block host", "pinned", "peak RSS", "request", "step (median)", "stall",
                   "H2D"):
        table.add_column(column, justify="right")
    for k in r.ranks:
        table.add_row(str(k.rank), str(k.seed), format_seconds(k.load_seconds), format_bytes(k.block_host_bytes),
                      format_bytes(k.pinned_bytes), format_bytes(k.host_peak_bytes), format_seconds(k.request_seconds),
                      format_seconds(k.step_s_median) if k.step_s_median is not None else "—",
                      format_seconds(k.stall_s_total), format_bytes(k.h2d_bytes_total))
    console.print(table)
    console.print(f"{r.gpus} requests in {format_seconds(r.wall_seconds)} (streamed blocks: "
                  f"{format_bytes(r.streamed_bytes)} per rank per forward)", markup=False, highlight=False)
    for k in r.ranks:
        console.print(plain(f"wrote {', '.join(k.files) or 'nothing'}"), markup=False, highlight=False, soft_wrap=True)
