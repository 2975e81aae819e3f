"""The request history (command palette: "Request history"): what was served, newest first.

The engine's `History` (read from the cache's `history.json` when the console opened, bounded and
validated; a file that cannot be used is ignored, and its one note is shown above the empty table), with
what this console served since. ↑/↓ select a row; `enter` submits that request again with its settings
(the screen closes with it; the app queues it). Esc closes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from ...engine.api import plain
from ..history_text import history_table


class HistoryScreen(Screen[Any]):
    """A full screen (nothing beneath shows through): the note, if any, then the table. Dismissed with the
    entry to run again, or None."""

    DEFAULT_CSS = """
    HistoryScreen { background: $surface; }
    HistoryScreen > VerticalScroll { border: round $primary; padding: 0 1; height: 1fr; }
    HistoryScreen #history-note { color: $warning; padding: 0 1; }
    """

    BINDINGS = [
        Binding("escape", "close", "close", id="history.close"),
        Binding("up", "select(-1)", "prev", show=False, id="history.up"),
        Binding("down", "select(1)", "next", show=False, id="history.down"),
        Binding("enter", "rerun", "run again", id="history.rerun",
                tooltip="submit the selected request again with its settings"),
    ]

    def __init__(self, entries: Sequence[Any], note: str | None = None) -> None:
        super().__init__()
        self.entries, self.note = list(entries), note
        self.selected = 0  # 0: the newest

    def compose(self) -> ComposeResult:
        if self.note:
            yield Static(plain(self.note), id="history-note", markup=False)  # it names a path (data)
        with VerticalScroll() as scroll:
            scroll.border_title = (f"request history ({len(self.entries)}, newest first; "
                                   "enter runs again, esc closes)")
            yield Static(self._table(), id="history-rows")

    def _table(self) -> Any:
        return history_table(self.entries, self.selected if self.entries else None)

    def action_select(self, delta: int) -> None:
        if self.entries:
            self.selected = max(0, min(len(self.entries) - 1, self.selected + delta))
            self.query_one("#history-rows", Static).update(self._table())

    def action_rerun(self) -> None:
        if self.entries:
            self.dismiss(self.entries[len(self.entries) - 1 - self.selected])

    def action_close(self) -> None:
        self.dismiss(None)
