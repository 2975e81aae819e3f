"""The live screen's headline: allocated, reserved, free and the last step's time on one line
(named `last step`: the step panel shows the median, the forecast line the forecast).

The memory panels below hold every reading with its history, but on an 80x24 terminal they run
past the bottom of the screen; these four numbers are what an operator watches, so they sit above
the panels and are always visible.
"""

from __future__ import annotations

from textual.widgets import Static

from ...engine import events
from ...engine.api import TelemetrySnapshot
from ...offload.units import format_bytes, format_seconds
from .text_update import set_text

NOT_YET = "—"


def _bytes(value: int | None) -> str:
    return NOT_YET if value is None else format_bytes(value)


class KeyNumbers(Static):
    """`allocated … · reserved … · free … · step …`; each is — until it is first reported."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.values = {"allocated": NOT_YET, "reserved": NOT_YET, "free": NOT_YET, "last step": NOT_YET}

    def on_mount(self) -> None:
        self._draw()

    def show_snapshot(self, snapshot: TelemetrySnapshot) -> None:
        torch = snapshot.torch
        free = snapshot.free_for_us if snapshot.free_for_us is not None else torch.free
        self.values.update(allocated=_bytes(torch.allocated), reserved=_bytes(torch.reserved), free=_bytes(free))
        self._draw()

    def show_step(self, step: events.StepTiming) -> None:
        self.values["last step"] = f"{format_seconds(step.wall_s)} (stall {format_seconds(step.stall_s)})"
        self._draw()

    @property
    def text(self) -> str:
        return " · ".join(f"{name} {value}" for name, value in self.values.items())

    def on_resize(self) -> None:
        if self.content_size.width != getattr(self, "_drawn_width", None):  # a new width only
            self._draw()

    def _draw(self) -> None:
        """On a narrow terminal the line breaks between figures (after ` · `), never inside one
        (`stall 50.0` / `ms`): the breaks are placed here, so no line is longer than the widget."""
        self._drawn_width = self.content_size.width
        width = self.content_size.width or (self.app.size.width - 2 if self.is_attached else 0)
        lines: list[str] = []
        line = ""
        for name, value in self.values.items():
            figure = f"{name} {value}"
            candidate = f"{line} · {figure}" if line else figure
            if line and width and len(candidate) > width:
                lines.append(f"{line} ·")
                line = figure
            else:
                line = candidate
        lines.append(line)
        set_text(self, "\n".join(lines))
