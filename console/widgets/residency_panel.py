"""Where each component's weights are right now: resident, on device, on host or in flight."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from omni_console.offload.units import format_bytes

from ...engine.api import plain
from ..theme_colors import follow_theme, resolve, widget_variables
from .text_update import set_text

STATES = ("resident", "device", "host", "in_flight", "idle_expert")
"""resident: kept on the device by policy; device: a staged/streamed part currently loaded;
host: offloaded to pinned host memory; in_flight: copy in progress (the streamer's `block_states`);
idle_expert: the blocks of the expert that is not running (two experts, Wan 2.2 A14B), parked in
pinned host memory until the pipeline switches to it (engine/running/residency_snapshot.py)."""

STATE_STYLE = {
    "resident": "bold $success",
    "device": "$primary",
    "host": "$foreground-muted",
    "in_flight": "bold $warning",
    "idle_expert": "italic $secondary",
}
"""Theme variables, resolved against the active theme when drawn (and redrawn when it changes)."""


class ResidencyRow(NamedTuple):
    name: str
    state: str
    nbytes: int | None = None


def _coerce(rows: Iterable[ResidencyRow | tuple]) -> list[ResidencyRow]:
    out = []
    for row in rows:
        r = ResidencyRow(*row)
        if r.state not in STATES:
            raise ValueError(f"unknown residency state {r.state!r} for {r.name!r}; expected one of {STATES}")
        out.append(r)
    return out


def summarize(rows: list[ResidencyRow]) -> str:
    """Bytes per state, e.g. "resident 9.5 GB · host 23.8 GB"."""
    if not rows:
        return "no components"
    totals: dict[str, int] = {}
    for r in rows:
        totals[r.state] = totals.get(r.state, 0) + (r.nbytes or 0)
    return " · ".join(f"{s.replace('_', ' ')} {format_bytes(totals[s])}" for s in STATES if s in totals)


class ResidencyPanel(Vertical):
    """A table of (component, state, bytes) with per-state totals; `update_rows` replaces it."""

    DEFAULT_CSS = """
    ResidencyPanel { border: round $primary; height: auto; max-height: 100%; padding: 0 1; }
    ResidencyPanel > .summary { height: auto; color: $text-muted; }
    ResidencyPanel > DataTable { height: auto; max-height: 30; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.rows: list[ResidencyRow] = []
        self.border_title = "residency"

    def compose(self) -> ComposeResult:
        yield Static(summarize([]), classes="summary", markup=False)
        table: DataTable = DataTable(cursor_type="row", zebra_stripes=True)
        table.add_column("component", key="name")
        table.add_column("state", key="state")
        table.add_column("bytes", key="bytes")
        yield table

    def on_mount(self) -> None:
        self._render_rows(rebuild=True)
        follow_theme(self, lambda: self._render_rows(rebuild=False))  # every state cell, in the new colours

    def update_rows(self, rows: Iterable[ResidencyRow | tuple]) -> None:
        """Replace the rows; same names in the same order update in place (cursor kept)."""
        new = _coerce(rows)
        rebuild = [r.name for r in new] != [r.name for r in self.rows]
        old, self.rows = self.rows, new
        if self.is_mounted:
            self._render_rows(rebuild, old)

    def _render_rows(self, rebuild: bool, old: list[ResidencyRow] | None = None) -> None:
        table = self.query_one(DataTable)
        variables = widget_variables(self)
        cells = [
            (Text(plain(r.name)), Text(r.state.replace("_", " "), style=resolve(STATE_STYLE[r.state], variables)),
             format_bytes(r.nbytes))
            for r in self.rows
        ]
        if rebuild:
            table.clear()
            for r, (name, state, size) in zip(self.rows, cells, strict=True):
                table.add_row(name, state, size, key=r.name)
        else:
            for i, (r, (_, state, size)) in enumerate(zip(self.rows, cells, strict=True)):
                if old is not None and i < len(old) and old[i] == r:
                    continue  # unchanged rows are not redrawn (a redraw of a table row is not cheap)
                table.update_cell(r.name, "state", state)
                table.update_cell(r.name, "bytes", size)
        set_text(self.query_one(".summary", Static), summarize(self.rows))
