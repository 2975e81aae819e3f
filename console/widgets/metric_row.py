"""One labelled number with its history sparkline: the building block of the memory panels."""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Sparkline, Static

from .text_update import set_text
from .zero_sparkline import ZeroSparkline

HISTORY_SAMPLES = 1200
"""Default history per metric: two minutes at the default telemetry rate (`DEFAULT_HZ`, 10 Hz)."""


class MetricRow(Horizontal):
    """`label  value  ▁▂▅▇` — the value is text, the sparkline plots the raw number.

    Missing values (None) show "N/A" (the reason goes to the tooltip and the panel's notes)
    and add no point to the history, so a gap never reads as zero.
    """

    DEFAULT_CSS = """
    MetricRow { height: 1; width: 1fr; }
    MetricRow > .metric-label { width: 45; height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    MetricRow > .metric-value {
        width: 16; height: 1; padding-right: 1; text-align: right;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    MetricRow > Sparkline { width: 1fr; min-width: 4; height: 1; }
    MetricRow.-na > .metric-value { color: $text-muted; }
    MetricRow.-alert > .metric-value { color: $warning; text-style: bold; }
    """

    def __init__(
        self,
        key: str,
        label: str,
        *,
        history: int = HISTORY_SAMPLES,
        sparkline: bool = True,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        if history < 1:
            raise ValueError(f"history must be >= 1 sample, got {history}")
        self.key = key
        self.label = label
        self.history: deque[float] = deque(maxlen=history)
        self.text = "N/A"
        self.reason: str | None = None
        self._with_sparkline = sparkline

    def compose(self) -> ComposeResult:
        yield Static(self.label, classes="metric-label", markup=False)
        yield Static(self.text, classes="metric-value", markup=False)
        if self._with_sparkline:
            yield ZeroSparkline(list(self.history))  # from zero: equal values, equal bars

    def extend(self, values: list[float | None]) -> None:
        """Append past values to the history only (a replay before the next `push` redraws)."""
        self.history.extend(float(v) for v in values if v is not None)

    def push(self, value: float | None, text: str, reason: str | None = None, *, alert: bool = False) -> None:
        """Show `text`, and append `value` to the history unless it is missing."""
        self.text = "N/A" if value is None else text
        self.reason = reason if value is None else None
        if value is not None:
            self.history.append(float(value))
        self.set_class(value is None, "-na")
        self.set_class(alert, "-alert")
        if not self.is_mounted:
            return
        cell = self.query_one(".metric-value", Static)
        set_text(cell, self.text, fixed_size=True)  # fixed 1-line cell: no reflow
        cell.tooltip = self.reason
        if self._with_sparkline and value is not None:
            self.query_one(Sparkline).data = list(self.history)
