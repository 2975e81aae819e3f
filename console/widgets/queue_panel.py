"""The live screen's request queue: the running request, then the waiting ones in the order they will run.

Each row: position (▶ for the running one), state, prompt, size, and the engine's forecast step time and
peak for it (… until the engine thread has answered). Hidden while nothing runs or waits. Focused (tab),
↑/↓ select a request; x cancels it (the running one at its next safe point), [ and ] move a waiting one
earlier or later, X clears every waiting request. The app acts (the engine's request service owns the
queue); the panel only names the request.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text
from textual.binding import Binding
from textual.widgets import Static

from ..request_queue import QueueRow, row_cells


class QueuePanel(Static, can_focus=True):
    """The queue's rows with a selection the keys act on."""

    DEFAULT_CSS = """
    QueuePanel { height: auto; max-height: 7; border: round $primary-darken-1; padding: 0 1; display: none; }
    QueuePanel.-shown { display: block; }
    QueuePanel:focus { border: round $accent; }
    """

    BINDINGS = [
        Binding("up", "select(-1)", "prev", show=False, id="queue.up"),
        Binding("down", "select(1)", "next", show=False, id="queue.down"),
        Binding("x,delete", "cancel_request", "cancel request", id="queue.cancel",
                tooltip="cancel the selected request (the running one stops at its next safe point)"),
        Binding("left_square_bracket", "move(-1)", "earlier", id="queue.earlier",
                tooltip="run the selected waiting request earlier"),
        Binding("right_square_bracket", "move(1)", "later", id="queue.later",
                tooltip="run the selected waiting request later"),
        Binding("X", "clear_queue", "clear queue", id="queue.clear", tooltip="cancel every waiting request"),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.rows: list[QueueRow] = []
        self.selected = 0
        self.border_title = "queue"

    def show(self, rows: Sequence[QueueRow]) -> None:
        """The rows now (the selection stays on its request when it is still there)."""
        keep = self.rows[self.selected].ticket if self.rows and self.selected < len(self.rows) else None
        self.rows = list(rows)
        tickets = [r.ticket for r in self.rows]
        self.selected = tickets.index(keep) if keep in tickets else min(self.selected, max(len(self.rows) - 1, 0))
        self.set_class(bool(self.rows), "-shown")
        waiting = sum(r.state != "running" for r in self.rows)
        self.border_title = f"queue: {waiting} waiting"  # its keys are in the footer while it is focused
        self.update(self._table())

    def selected_ticket(self) -> int | None:
        return self.rows[self.selected].ticket if self.rows else None

    def _table(self) -> Table | Text:
        if not self.rows:
            return Text("")
        table = Table(box=None, padding=(0, 1), expand=True, show_header=True, header_style="bold")
        for name, options in (("#", {"justify": "right"}), ("state", {}), ("prompt", {"ratio": 1}), ("size", {}),
                              ("step", {"justify": "right"}), ("peak", {"justify": "right"})):
            table.add_column(name, no_wrap=True, overflow="ellipsis", **options)
        position = 0
        for i, row in enumerate(self.rows):
            if row.state != "running":
                position += 1
            cells = row_cells(position, row)
            style = "reverse" if i == self.selected and self.has_focus else ""
            table.add_row(*(Text(c) for c in cells), style=style)
        return table

    def on_focus(self) -> None:
        self.show(self.rows)

    def on_blur(self) -> None:
        self.show(self.rows)

    def action_select(self, delta: int) -> None:
        if self.rows:
            self.selected = max(0, min(len(self.rows) - 1, self.selected + delta))
            self.update(self._table())

    def action_cancel_request(self) -> None:
        ticket = self.selected_ticket()
        if ticket is not None:
            self.app.queue_cancel(ticket)  # type: ignore[attr-defined]

    def action_move(self, delta: int) -> None:
        ticket = self.selected_ticket()
        if ticket is not None:
            self.app.queue_move(ticket, delta)  # type: ignore[attr-defined]

    def action_clear_queue(self) -> None:
        self.app.queue_clear()  # type: ignore[attr-defined]
