"""The plan screen's component table: one row per component with its resolved residency.

Rows are keyed by component name and updated in place when the policy changes, so the cursor
stays on the row the operator is toggling.
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text
from textual.widgets import DataTable

from ...engine.api import Plan, plain, planner
from ...offload.units import format_bytes
from ..plan_view import RESIDENCY_LABEL, RESIDENCY_STYLE, blocks_cell
from ..theme_colors import follow_theme, resolve, widget_variables

COLUMNS = (("component", "name"), ("residency", "residency"), ("source", "source"), ("role", "role"),
           ("size", "size"), ("blocks", "blocks"), ("dtype", "dtype"), ("class", "class"))
"""Residency and its source first: they are what the operator edits, and stay visible at 80 columns."""
SOURCES = {"explicit", "default", "implicit"}


def residency_text(c: planner.ComponentPlan) -> str:
    label = RESIDENCY_LABEL[c.residency]
    if c.residency == "streamed" and c.resident_layers:
        label += f" ({c.resident_layers} resident)"
    return label


def source_text(c: planner.ComponentPlan) -> str:
    """explicit / default / implicit for policy-controlled rows; what decided it otherwise."""
    if c.why in SOURCES:
        return c.why
    return {"dlo": "DLO", "mode": "mode=resident", "no-weights": "—", "not-auxiliary": "always",
            "no-blocks": "no block lists", "unused": "never called"}.get(c.why, c.why)


def row_cells(c: planner.ComponentPlan, readonly: bool, variables: Mapping[str, str]) -> list:
    """The row's cells; the residency is coloured with `variables` (the active theme's)."""
    style = "dim" if readonly else resolve(RESIDENCY_STYLE[c.residency], variables)
    info = c.info
    return [  # names and classes come from the model directory: Text, never markup, controls escaped
        Text(plain(info.name)), Text(residency_text(c), style=style), Text(plain(source_text(c))),
        Text(plain(info.role)), Text(format_bytes(info.nbytes) if info.has_weights else "—", justify="right"),
        Text(blocks_cell(c)), Text(plain(", ".join(info.dtypes) or "—")), Text(plain(info.class_name or "")),
    ]


class ComponentTable(DataTable):
    """Components of the plan; `show_plan` refreshes them, `selected_name` is the cursor row."""

    DEFAULT_CSS = """
    ComponentTable { height: auto; max-height: 20; }
    ComponentTable.-readonly { opacity: 60%; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.plan: Plan | None = None
        self.readonly = False

    def on_mount(self) -> None:
        for label, key in COLUMNS:
            self.add_column(label, key=key)
        if self.plan is not None:
            self.show_plan(self.plan)
        follow_theme(self, self._redraw)

    def _redraw(self) -> None:
        if self.plan is not None:
            self.show_plan(self.plan, readonly=self.readonly)

    def show_plan(self, plan: Plan, *, readonly: bool = False) -> None:
        names = [c.info.name for c in plan.components]
        rebuild = self.plan is None or [c.info.name for c in self.plan.components] != names or self.row_count == 0
        self.plan, self.readonly = plan, readonly
        self.set_class(readonly, "-readonly")
        if not self.is_mounted or not self.columns:
            return
        variables = widget_variables(self)
        if rebuild:
            self.clear()
            for c in plan.components:
                self.add_row(*row_cells(c, readonly, variables), key=c.info.name)
            return
        for c in plan.components:
            cells = row_cells(c, readonly, variables)
            self.update_cell(c.info.name, "residency", cells[1], update_width=True)
            self.update_cell(c.info.name, "source", cells[2], update_width=True)

    @property
    def selected_name(self) -> str | None:
        if self.plan is None or not self.row_count:
            return None
        row = min(max(self.cursor_row, 0), self.row_count - 1)
        return self.plan.components[row].info.name

