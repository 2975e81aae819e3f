"""Per-step timing: wall time, exposed transfer stall, steps/s and bytes copied per step.

The stall is the time compute waited on weight copies — the cost of offload the operator is
tuning against, so it gets its own sparkline next to the wall time. Both sparklines are drawn
from zero: equal times draw equal bars. On a CPU the copies are host copies (no device link), and
the panel says so instead of "copied".
"""

from __future__ import annotations

import statistics
from collections import deque

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Sparkline, Static

from omni_console.offload.units import format_bytes, format_rate, format_seconds

from ...engine import events
from .metric_row import HISTORY_SAMPLES
from .text_update import set_text
from .zero_sparkline import ZeroSparkline

TABLE_ROWS = 500
MEDIAN_WINDOW = 10


def summarize(steps: list[events.StepTiming], *, on_cpu: bool = False) -> str:
    """The summary line over the last steps: the median of up to MEDIAN_WINDOW (a slow first step or
    a hiccup does not move it), named as such; the header shows the last step, the forecast line the
    forecast, each under its own name and all in `format_seconds`."""
    if not steps:
        return "no steps yet"
    last = steps[-1]
    window = steps[-MEDIAN_WINDOW:]
    wall = statistics.median(s.wall_s for s in window)
    stall = statistics.median(s.stall_s for s in window)
    copied = statistics.median(s.h2d_bytes for s in window)
    pct = 100.0 * stall / wall if wall > 0 else 0.0
    copies = f"host copies {format_bytes(copied)}/step (CPU: no device link)" if on_cpu else (
        f"copied {format_bytes(copied)}/step" + (f" ({format_rate(copied / wall)})" if wall > 0 and copied else "")
    )
    return (
        f"request {last.request_id} step {last.step}/{last.total_steps} · "
        f"median step (last {len(window)}) {format_seconds(wall)} · "
        f"stall {format_seconds(stall)} ({pct:.0f} %) · {copies}"
    )


def copied_cell(s: events.StepTiming) -> str:
    """The step's copied bytes; with a step cache, its hits and the bytes it skipped (never copied) beside them."""
    if not s.cache_forwards:
        return format_bytes(s.h2d_bytes)
    hits = f"hit {s.cache_hits}/{s.cache_forwards}"
    return f"{format_bytes(s.h2d_bytes)} ({hits}, skipped {format_bytes(s.skipped_bytes)})"


class StepTimings(Vertical):
    """Summary line, wall/stall sparklines and a bounded table of recent steps."""

    DEFAULT_CSS = """
    StepTimings { border: round $success; height: 1fr; min-height: 6; padding: 0 1; }
    StepTimings > .summary { height: auto; }
    StepTimings > Horizontal { height: 1; }
    StepTimings > Horizontal > .spark-label { width: 14; }
    StepTimings > Horizontal > Sparkline { width: 1fr; height: 1; }
    StepTimings > DataTable { height: 1fr; }
    """

    COLUMNS = ("request", "step", "wall", "stall", "stall %", "steps/s", "copied")

    def __init__(
        self,
        *,
        history: int = HISTORY_SAMPLES,
        max_rows: int = TABLE_ROWS,
        on_cpu: bool = False,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.steps: deque[events.StepTiming] = deque(maxlen=history)
        self._max_rows = max_rows
        self.on_cpu = on_cpu
        self._row_keys: deque = deque()
        self.check_text = ""
        self.border_title = "step timings"

    def compose(self) -> ComposeResult:
        yield Static(summarize([], on_cpu=self.on_cpu), classes="summary", markup=False)
        yield Static("", classes="forecast-check", markup=False)
        with Horizontal(id="wall-row"):
            yield Static("wall s/step", classes="spark-label")
            yield ZeroSparkline([], id="wall-spark")
        with Horizontal(id="stall-row"):
            yield Static("stall s/step", classes="spark-label")
            yield ZeroSparkline([], id="stall-spark")
        table: DataTable = DataTable(cursor_type="row", zebra_stripes=True)
        table.add_columns(*self.COLUMNS[:-1], "host copy" if self.on_cpu else self.COLUMNS[-1])
        yield table

    def on_mount(self) -> None:
        self._redraw()
        self._show_check_line()

    def _show_check_line(self) -> None:
        """Shown once a request has ended (an empty line before that would cost a row at 80x24)."""
        line = self.query_one(".forecast-check", Static)
        set_text(line, self.check_text)
        line.display = bool(self.check_text)

    def add_step(self, step: events.StepTiming) -> None:
        """Append one step (oldest table rows and history points fall off when full)."""
        self.steps.append(step)
        if not self.is_mounted:
            return
        self._add_row(step)
        self._refresh_summary()

    def add_steps(self, steps: list[events.StepTiming]) -> None:
        """Append a drained batch with one summary/sparkline refresh."""
        self.steps.extend(steps)
        if not self.is_mounted or not steps:
            return
        for s in steps[-self._max_rows :]:
            self._add_row(s, move=False)
        table = self.query_one(DataTable)
        table.move_cursor(row=table.row_count - 1, animate=False)
        self._refresh_summary()

    def show_check(self, text: str) -> None:
        """The last request's predicted vs measured line (step time and peak)."""
        self.check_text = text
        if self.is_mounted:
            self._show_check_line()

    def reset(self) -> None:
        """Forget every step (a new model or a new run)."""
        self.steps.clear()
        self.check_text = ""
        if self.is_mounted:
            self._redraw()
            self._show_check_line()

    def _add_row(self, s: events.StepTiming, move: bool = True) -> None:
        table = self.query_one(DataTable)
        pct = 100.0 * s.stall_s / s.wall_s if s.wall_s > 0 else 0.0
        rate = 1.0 / s.wall_s if s.wall_s > 0 else 0.0
        key = table.add_row(
            str(s.request_id),
            f"{s.step}/{s.total_steps}",
            format_seconds(s.wall_s),
            format_seconds(s.stall_s),
            f"{pct:.0f}",
            f"{rate:.2f}",
            copied_cell(s),
        )
        self._row_keys.append(key)
        while len(self._row_keys) > self._max_rows:
            table.remove_row(self._row_keys.popleft())
        if move:
            table.move_cursor(row=table.row_count - 1, animate=False)

    def _refresh_summary(self) -> None:
        set_text(self.query_one(".summary", Static), summarize(list(self.steps), on_cpu=self.on_cpu))
        self.query_one("#wall-spark", Sparkline).data = [s.wall_s for s in self.steps]
        self.query_one("#stall-spark", Sparkline).data = [s.stall_s for s in self.steps]

    def _redraw(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        self._row_keys.clear()
        for s in list(self.steps)[-self._max_rows :]:
            self._add_row(s)
        self._refresh_summary()
