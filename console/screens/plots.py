"""`v` on the live screen: the request's plots — device memory, and the link's rate with each step's exposed
stall — on one time axis with its phases and steps marked; `e` writes its trace, Esc or v closes.

The plots redraw from the console's `RequestRecord` (events it receives anyway) at most every PLOT_REFRESH_S
and only when the record changed, and only while this screen is open: watching costs the engine nothing.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen

from ...offload.units import format_seconds
from ..request_record import RequestRecord
from ..widgets.fitted_text import FittedText
from ..widgets.request_plots import LinkPlot, MemoryPlot
from ..widgets.steady_footer import SteadyFooter

PLOT_REFRESH_S = 0.5
"""The plots redraw at most twice a second (plotext builds the whole figure each time)."""


def record_line(record: RequestRecord) -> str:
    """What the plots are of: the request, its state, its steps so far."""
    started = record.started
    if started is None:
        return "no request yet — the plots fill when one runs (g on the live screen)"
    steps = record.steps
    state = "running"
    if record.finished is not None:
        state = f"done in {format_seconds(record.finished.seconds)}" if record.finished.ok else "failed"
    done = f"{steps[-1].step}/{steps[-1].total_steps} steps" if steps else "no step yet"
    return f"request {started.request_id} · {state} · {done} · x: seconds from its start"


class PlotScreen(Screen[None]):
    """The request's plots (see the module docstring)."""

    BINDINGS = [
        Binding("escape,v", "close", "close", id="plots.close", tooltip="back to the live screen"),
        Binding("e", "app.write_trace", "trace", id="plots.trace",
                tooltip="write the request's Chrome/Perfetto trace (JSON) in the output folder"),
    ]

    DEFAULT_CSS = """
    PlotScreen #plots-line { height: 1; padding: 0 1; }
    PlotScreen RequestPlot { height: 1fr; }
    """

    def __init__(self, record: RequestRecord) -> None:
        super().__init__()
        self.record = record
        self.line = FittedText(id="plots-line")
        self.memory = MemoryPlot(id="memory-plot")
        self.link = LinkPlot(id="link-plot")
        self._drawn = -1

    def compose(self) -> ComposeResult:
        yield self.line
        yield self.memory
        yield self.link
        yield SteadyFooter(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.call_after_refresh(self.redraw)
        self.set_interval(PLOT_REFRESH_S, self.redraw, name="plots")

    def redraw(self) -> None:
        """Draw the record if it changed since the last drawing."""
        if self.record.version == self._drawn:
            return
        self._drawn = self.record.version
        self.line.show(record_line(self.record))
        self.memory.show(self.record)
        self.link.show(self.record)

    def action_close(self) -> None:
        self.dismiss()
