"""The request history (command palette: "Request history"): what was served, newest first.

Read from the cache's `history.json` when opened (the engine's `History`: bounded, validated; a file
that cannot be used is ignored, and its one note is shown above the empty table). Esc closes it.
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


class HistoryScreen(Screen[None]):
    """A full screen (nothing beneath shows through): the note, if any, then the table."""

    DEFAULT_CSS = """
    HistoryScreen { background: $surface; }
    HistoryScreen > VerticalScroll { border: round $primary; padding: 0 1; height: 1fr; }
    HistoryScreen #history-note { color: $warning; padding: 0 1; }
    """

    BINDINGS = [Binding("escape", "close", "close", id="history.close")]

    def __init__(self, entries: Sequence[Any], note: str | None = None) -> None:
        super().__init__()
        self.entries, self.note = list(entries), note

    def compose(self) -> ComposeResult:
        if self.note:
            yield Static(plain(self.note), id="history-note", markup=False)  # it names a path (data)
        with VerticalScroll() as scroll:
            scroll.border_title = f"request history ({len(self.entries)}, newest first; esc closes)"
            yield Static(history_table(self.entries), id="history-rows")

    def action_close(self) -> None:
        self.dismiss(None)
