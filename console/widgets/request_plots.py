"""The request's plots (textual-plotext): device memory, and the link's rate with each step's exposed stall,
on one time axis (seconds from the request's start) with text encoding, each step and the decode marked.

Each plot draws what `RequestRecord` holds (console/request_record.py) when `show` is called; the plot screen
calls it at most every PLOT_REFRESH_S while it is open, so a closed plot costs nothing. Long series are thinned
to a few points per column, keeping each column's highest value (a memory peak is never thinned away).
"""

from __future__ import annotations

from collections.abc import Sequence

from textual_plotext import PlotextPlot

from ..request_record import RequestRecord, Series

POINTS_PER_COLUMN = 2
STEP_MARK_LIMIT = 40
"""More steps than this: only every n-th step's start is marked (the lines would fill the plot)."""


def thinned(series: Series, limit: int) -> Series:
    """At most `limit` points: consecutive points grouped, each group's highest kept (at its first x)."""
    n = len(series.x)
    if n <= limit or limit <= 0:
        return series
    size = -(-n // limit)
    xs, ys = [], []
    for i in range(0, n, size):
        xs.append(series.x[i])
        ys.append(max(series.y[i:i + size]))
    return Series(series.label, xs, ys)


class RequestPlot(PlotextPlot):
    """A plotext plot of one part of the request; `series` is what it drew last (for readers and tests)."""

    DEFAULT_CSS = "RequestPlot { height: 1fr; min-height: 8; }"

    def __init__(self, title: str, *, id: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__(id=id)
        self.title = title
        self.series: list[Series] = []

    def _begin(self, record: RequestRecord) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        plt.xlabel("s")
        self._marks(record.marks())

    def _marks(self, marks: Sequence[tuple[float, str]]) -> None:
        """A vertical line where each phase and step begins; the phases' names on the time axis."""
        steps = [m for m in marks if m[1].startswith("step ")]
        every = max(1, -(-len(steps) // STEP_MARK_LIMIT))
        shown = {m for i, m in enumerate(steps) if i % every == 0}
        ticks: list[tuple[float, str]] = []
        for x, name in marks:
            if name.startswith("step "):
                if (x, name) in shown:
                    self.plt.vline(x, "gray")
                if name.startswith("step 1/"):
                    ticks.append((x, "steps"))
            else:
                self.plt.vline(x, "gray")
                ticks.append((x, {"text_encoding": "text", "vae_decode": "decode"}.get(name, name)))
        ticks = self._apart([(x, f"{label} {x:.1f}") for x, label in ticks])
        if ticks:
            self.plt.xticks([x for x, _ in ticks], [label for _, label in ticks])

    def _apart(self, ticks: list[tuple[float, str]]) -> list[tuple[float, str]]:
        """The tick labels that fit side by side at this width, earliest first: two labels that would overlap make
        plotext pick one in an order of its own (which changed between processes), so the later one is left out
        here."""
        if len(ticks) < 2:
            return ticks
        span = (ticks[-1][0] - ticks[0][0]) or 1.0
        columns = max(1, self.size.width - 16) / span  # the axis' columns per second, less the y labels' room
        kept = [ticks[0]]
        for x, label in ticks[1:]:
            last_x, last_label = kept[-1]
            if (x - last_x) * columns > len(last_label) + len(label) / 2 + 3:  # a label may be centred or shifted
                kept.append((x, label))
        return kept

    def _draw(self, series: Series, *, scatter: bool = False, yside: str = "left") -> None:
        limit = max(8, self.size.width * POINTS_PER_COLUMN)
        shown = thinned(series, limit)
        if not shown.x:
            return
        draw = self.plt.scatter if scatter else self.plt.plot
        draw(shown.x, shown.y, label=shown.label, yside=yside, marker="braille" if not scatter else "dot")
        self.series.append(shown)


class MemoryPlot(RequestPlot):
    """Device memory over the request: allocated, reserved, NVML's for this process (GB)."""

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__("device memory (GB)", id=id)

    def show(self, record: RequestRecord) -> None:
        self.series = []
        self._begin(record)
        memory = record.memory()
        if memory and memory[0].label == "host RSS":
            self.plt.title("process memory (GB; on a CPU there is no device memory)")
        for series in memory:
            self._draw(series)
        self.refresh()


class LinkPlot(RequestPlot):
    """The link's host→device rate (GB/s, left) and each step's exposed stall (ms, right)."""

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__("link GB/s (left) · stall per step ms (right)", id=id)

    def show(self, record: RequestRecord) -> None:
        self.series = []
        self._begin(record)
        self._draw(record.link())
        self._draw(record.stalls(), scatter=True, yside="right")
        self.refresh()
