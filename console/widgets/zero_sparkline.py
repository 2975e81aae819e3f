"""A one-line sparkline whose bars are scaled from zero, so equal values always draw equal bars.

Textual's sparkline scales from the series' minimum to its maximum: two stalls of 0.011 s and
0.0111 s draw as the lowest and the highest bar, which reads as "the stall doubled". Scaling from
zero keeps a bar's height proportional to the value (zero draws the lowest bar).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from rich.color import Color
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style
from textual.app import RenderResult as WidgetRenderResult
from textual.renderables._blend_colors import blend_colors
from textual.widgets import Sparkline

BARS = "▁▂▃▄▅▆▇█"


def zero_based_bars(data: Sequence[float], width: int) -> list[tuple[str, float]]:
    """(bar, ratio of the series' maximum) per column: columns split the series into buckets (their
    maximum is drawn), and a series shorter than the width is stretched across it."""
    if width <= 0:
        return []
    if not data:
        return [(BARS[0], 0.0)] * width
    points = [max(float(v), 0.0) for v in data]
    step = Fraction(len(points), width)
    buckets = [points[int(step * i):int(step * (i + 1))] for i in range(width)]
    buckets = [b for b in buckets if b]
    top = max(points)
    bars = []
    for column in range(width):
        value = max(buckets[int(column * len(buckets) / width)])
        ratio = value / top if top > 0 else 0.0
        bars.append((BARS[round(ratio * (len(BARS) - 1))], ratio))
    return bars


class _ZeroBars:
    """The rich renderable: one line of bars coloured from `low` (zero) to `high` (the maximum)."""

    def __init__(self, data: Sequence[float], width: int, low: Color, high: Color) -> None:
        self.data, self.width, self.low, self.high = data, width, low, high

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for bar, ratio in zero_based_bars(self.data, self.width or options.max_width):
            yield Segment(bar, Style.from_color(blend_colors(self.low, self.high, ratio)))


class ZeroSparkline(Sparkline):
    """`Sparkline` drawn from zero (one line high; taller ones fall back to Textual's drawing)."""

    def render(self) -> WidgetRenderResult:
        if self.size.height > 1:
            return super().render()
        _, base = self.background_colors
        low = base + self.get_component_styles("sparkline--min-color").color
        high = base + self.get_component_styles("sparkline--max-color").color
        return _ZeroBars(list(self.data or []), self.size.width, low.rich_color, high.rich_color)
