"""The GPU group panel: one line per rank of a multi-GPU group, so a lagging or full GPU stands out.

`GPU 1  alloc 12.3 GB · res 14.0 GB · NVML 30.1/141 GB · PCIe ↓12.3 ↑0.1 GB/s · step 7/20 0.25 s (stall 0.01)`

Each rank samples its own GPU (torch allocator, NVML) and times its own steps; the main memory
panels keep showing the console's own sample. A line never wraps: when the panel is narrow the
least telling fields are dropped (mean step, reserved, NVML, PCIe), and the line is cut last.
Fields a rank could not read read `—`; NVML that cannot be read at all says `NVML n/a`.
"""

from __future__ import annotations

from collections.abc import Mapping

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from omni_console.console.rank_stats import RankStats
from omni_console.offload.units import format_bytes

from .text_update import set_text

MISSING = "—"
SEP = " · "
DEFAULT_WIDTH = 76
"""The line width before the panel knows its size (an 80-column terminal less border and padding)."""
GB = 1e9


def _bytes(n: int | None) -> str:
    return MISSING if n is None else format_bytes(n)


def _gb(n: int | float) -> str:
    return f"{n / GB:.1f}"


def _seconds(s: float) -> str:
    return f"{s:.2f}"


def _nvml(stats: RankStats) -> tuple[str | None, str | None]:
    """(memory field, link field: PCIe and, where NVML reports it, NVLink) from the rank's NVML
    reading; None drops a field."""
    snapshot = stats.snapshot
    if snapshot is None:
        return None, None
    nvml = snapshot.nvml
    if nvml.unavailable:
        return "NVML n/a", None
    if nvml.used is None:
        memory = f"NVML {MISSING}"
    elif nvml.total is None:
        memory = f"NVML {format_bytes(nvml.used)}"
    elif nvml.total >= GB:
        memory = f"NVML {_gb(nvml.used)}/{nvml.total / GB:.0f} GB"
    else:
        memory = f"NVML {format_bytes(nvml.used)}/{format_bytes(nvml.total)}"
    pcie = _rates("PCIe", nvml.pcie_rx_bytes_per_s, nvml.pcie_tx_bytes_per_s)
    nvlink = _rates("NVLink", nvml.nvlink_rx_bytes_per_s, nvml.nvlink_tx_bytes_per_s)
    links = SEP.join(t for t in (pcie, nvlink) if t) or None
    return memory, links


def _rates(label: str, rx: int | None, tx: int | None) -> str | None:
    if rx is None and tx is None:
        return None
    return f"{label} ↓{MISSING if rx is None else _gb(rx)} ↑{MISSING if tx is None else _gb(tx)} GB/s"


def _step(stats: RankStats) -> str | None:
    if stats.step is None or stats.wall_s is None or stats.stall_s is None:
        return None
    return f"step {stats.step}/{stats.total_steps} {_seconds(stats.wall_s)} s (stall {_seconds(stats.stall_s)})"


def _mean(stats: RankStats) -> str | None:
    wall, stall = stats.mean_wall_s, stats.mean_stall_s
    if wall is None or stall is None or stats.steps_seen < 2:
        return None
    return f"mean {_seconds(wall)} s (stall {_seconds(stall)})"


def rank_line(stats: RankStats, width: int = DEFAULT_WIDTH) -> str:
    """One rank's line, at most `width` characters: low-priority fields go first, then the tail is cut."""
    head = f"GPU {stats.rank}"
    snapshot = stats.snapshot
    if snapshot is None and stats.step is None:
        return _cut(f"{head}  no telemetry yet", width)
    # (priority: lower is kept longer, text) in display order
    fields: list[tuple[int, str | None]] = []
    if snapshot is not None:
        torch = snapshot.torch
        if torch.unavailable:
            fields.append((1, "torch n/a"))
        else:
            fields.append((1, f"alloc {_bytes(torch.allocated)}"))
            fields.append((5, None if torch.reserved is None else f"res {_bytes(torch.reserved)}"))
        memory, pcie = _nvml(stats)
        fields.append((4, memory))
        fields.append((3, pcie))
    fields.append((0, _step(stats)))
    fields.append((6, _mean(stats)))
    kept = [(priority, text) for priority, text in fields if text]
    while kept:
        line = f"{head}  " + SEP.join(text for _, text in kept)
        if len(line) <= width or len(kept) == 1:
            return _cut(line, width)
        kept.remove(max(kept, key=lambda field: field[0]))
    return _cut(head, width)


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


class GpuGroupPanel(VerticalScroll):
    """One line per rank of the engine's group; fed with `show_ranks` (the event router's RankStats)."""

    DEFAULT_CSS = """
    GpuGroupPanel { height: auto; max-height: 10; border: round $primary; padding: 0 1; }
    GpuGroupPanel > Static { height: auto; text-wrap: nowrap; }
    """

    def __init__(self, world: int = 1, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.ranks: dict[int, RankStats] = {}
        self.body = Static("", markup=False)
        self.set_world(world)

    def compose(self) -> ComposeResult:
        yield self.body

    def set_world(self, world: int) -> None:
        """How many ranks the group has (each gets a line, spoken or not)."""
        self.world = world
        self.border_title = f"GPUs · {world} ranks (each rank's own GPU and steps)"
        self._render_lines()

    def on_mount(self) -> None:
        self._render_lines()

    def on_resize(self) -> None:
        self._render_lines()

    @property
    def lines(self) -> list[str]:
        """The lines shown now (one per rank, every rank of the group whether it has spoken or not)."""
        return self._lines(self._width())

    def show_ranks(self, ranks: Mapping[int, RankStats]) -> None:
        """The ranks' newest numbers (the router's dict: read now, not kept by reference)."""
        self.ranks = {rank: stats for rank, stats in ranks.items()}
        self._render_lines()

    def _width(self) -> int:
        width = self.scrollable_content_region.width if self.is_mounted else 0
        return width if width > 0 else DEFAULT_WIDTH

    def _lines(self, width: int) -> list[str]:
        ranks = sorted(set(range(self.world)) | set(self.ranks))
        return [rank_line(self.ranks.get(rank) or RankStats(rank), width) for rank in ranks]

    def _render_lines(self) -> None:
        if self.is_mounted:
            set_text(self.body, "\n".join(self._lines(self._width())))
