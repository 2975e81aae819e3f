"""The plan screen's per-DiT (or per-UNet) block lists: what `plan` prints as "DiT blocks (execution order)".

The component table's blocks cell reads `6 (2+4)`: 6 blocks in all, 2 in the first list and 4 in
the second, in the order the DiT runs them. This panel spells each list out (bytes per block,
how many leading blocks stay resident, how many are streamed) and its title says how to read the cell.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ...engine.plain_text import plain
from ...engine.plan import Plan
from ..plan_view import blocks_sheet

LEGEND = "blocks: total (per list, in execution order)"


class BlockListPanel(Static, can_focus=True):
    """One row per DiT (or UNet) block list; hidden for a pipeline without either."""

    DEFAULT_CSS = """
    BlockListPanel { height: auto; border: round $primary; padding: 0 1; }
    BlockListPanel.-empty { display: none; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.border_title = f"DiT block lists — {LEGEND}"
        self.rows: list[tuple[str, ...]] = []

    def show_plan(self, plan: Plan) -> None:
        self.border_title = f"{plan.model.block_kind} block lists — {LEGEND}"
        sheet = blocks_sheet(plan)
        self.rows = [] if sheet is None else list(sheet.rows)
        self.set_class(sheet is None, "-empty")
        if sheet is None:
            self.update("")
            return
        table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
        for name in sheet.header:
            table.add_column(name, justify="right" if name in sheet.right else "left", overflow="fold")
        for row in sheet.rows:
            table.add_row(*(Text(plain(cell)) for cell in row))  # DiT names come from data: never markup
        self.update(table)
