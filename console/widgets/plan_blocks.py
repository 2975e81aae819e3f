"""The plan screen's per-DiT (or per-UNet) block lists: what `plan` prints as "DiT blocks (execution order)".

The component table's blocks cell reads `6 (2+4)`: 6 blocks in all, 2 in the first list and 4 in
the second, in the order the DiT runs them. This panel spells each list out (bytes per block,
how many leading blocks stay resident, how many are streamed) and its title says how to read the cell.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ...engine.api import Plan, plain
from ..plan_view import blocks_sheet
from ..table_fit import fit_widths

LEGEND = "blocks: total (per list, in execution order)"
GAP = 2
"""Characters between two columns (padding 1 on each side, no border)."""


class BlockListPanel(Static, can_focus=True):
    """One row per DiT (or UNet) block list; hidden for a pipeline without either."""

    DEFAULT_CSS = """
    BlockListPanel { height: auto; border: round $primary; padding: 0 1; }
    BlockListPanel.-empty { display: none; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.border_title = f"block lists — {LEGEND}"
        self.rows: list[tuple[str, ...]] = []

    def show_plan(self, plan: Plan) -> None:
        self.border_title = f"{plan.model.block_kind} block lists — {LEGEND}"
        sheet = blocks_sheet(plan)
        self.rows = [] if sheet is None else list(sheet.rows)
        self.set_class(sheet is None, "-empty")
        self._sheet = sheet
        self._draw()

    def on_resize(self) -> None:
        if self._room() != getattr(self, "_drawn_room", None):  # a new width only: no layout pass otherwise
            self._draw()

    def _room(self) -> int | None:
        """Characters inside the border and padding; None before the first layout."""
        width = self.size.width or (self.app.size.width - 2 if self.is_attached else 0)
        return width - 4 if width > 4 else None

    def _draw(self) -> None:
        sheet = getattr(self, "_sheet", None)
        if sheet is None:
            self.update("")
            return
        room = self._drawn_room = self._room()
        header = sheet.header
        whole = {j for j, name in enumerate(header) if name in sheet.right}
        squeeze = {j for j, name in enumerate(header) if name in sheet.squeeze}
        widths = None
        if room is not None and fit_widths(header, sheet.rows, room - GAP * (len(header) - 1)) is not None:
            header = tuple(sheet.narrow_header.get(name, name) for name in header)
            widths = fit_widths(header, sheet.rows, room - GAP * (len(header) - 1), squeeze, whole)
        table = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False, header_style="bold")
        for j, name in enumerate(header):  # words wrap at spaces or are cut with `…`, never split (table_fit)
            table.add_column(name, justify="right" if j in whole else "left", overflow="ellipsis",
                             no_wrap=widths is None or j in whole, width=None if widths is None else widths[j])
        for row in sheet.rows:
            # DiT names come from data: never markup
            table.add_row(*(Text(plain(cell), overflow="ellipsis") for cell in row))
        self.update(table)
