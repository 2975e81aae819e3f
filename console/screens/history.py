"""The request history (command palette: "Request history"): what was served, newest first.

The engine's `History` (read from the cache's `history.json` when the console opened, bounded and
validated; a file that cannot be used is ignored, and its one note is shown above the empty table), with
what this console served since. ↑/↓ select a row; `enter` submits that request again with its settings
(the screen closes with it; the app queues it). Esc closes.

The selected row's output shows as a half-block thumbnail under the table, read on a thread, when it is a
file in the console's output folder (the history is cache input: a path it names elsewhere is not opened).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from ...engine.api import plain
from ..history_text import history_table
from ..output_frames import read_output, thumbnail_path
from ..widgets.halfblock import HalfBlockImage


class HistoryScreen(Screen[Any]):
    """A full screen (nothing beneath shows through): the note, if any, then the table. Dismissed with the
    entry to run again, or None."""

    DEFAULT_CSS = """
    HistoryScreen { background: $surface; }
    HistoryScreen > VerticalScroll { border: round $primary; padding: 0 1; height: 1fr; }
    HistoryScreen #history-note { color: $warning; padding: 0 1; }
    HistoryScreen #history-thumb { height: 10; border: round $primary; padding: 0 1; }
    """

    BINDINGS = [
        Binding("escape", "close", "close", id="history.close"),
        Binding("up", "select(-1)", "prev", show=False, id="history.up"),
        Binding("down", "select(1)", "next", show=False, id="history.down"),
        Binding("enter", "rerun", "run again", id="history.rerun",
                tooltip="submit the selected request again with its settings"),
    ]

    def __init__(self, entries: Sequence[Any], note: str | None = None, out_dir: Path | None = None) -> None:
        """`out_dir`: the console's output folder, the only place a thumbnail is read from (None: none)."""
        super().__init__()
        self.entries, self.note, self.out_dir = list(entries), note, out_dir
        self.selected = 0  # 0: the newest
        self.thumb = Static("", id="history-thumb")
        self.thumb.display = False  # until the selected row has an output to show
        self.thumb_path: Path | None = None

    def compose(self) -> ComposeResult:
        if self.note:
            yield Static(plain(self.note), id="history-note", markup=False)  # it names a path (data)
        with VerticalScroll() as scroll:
            scroll.border_title = (f"request history ({len(self.entries)}, newest first; "
                                   "enter runs again, esc closes)")
            yield Static(self._table(), id="history-rows")
        yield self.thumb

    def on_mount(self) -> None:
        self._load_thumb()

    def _selected_entry(self) -> Any:
        return self.entries[len(self.entries) - 1 - self.selected] if self.entries else None

    def _load_thumb(self) -> None:
        """The selected row's output, read off the UI thread; hidden when it has none to show."""
        entry = self._selected_entry()
        path = thumbnail_path(list(getattr(entry, "files", None) or []), self.out_dir) \
            if entry is not None and self.out_dir is not None else None
        self.thumb_path = path
        if path is None:
            self.thumb.display = False
            return
        self.run_worker(lambda: (path, read_output(path)), thread=True, exclusive=True, group="thumb",
                        name="history-thumb")

    def on_worker_state_changed(self, event: Any) -> None:
        worker = event.worker
        if worker.name != "history-thumb" or not worker.is_finished:
            return
        if worker.error is not None or worker.result is None:
            self.thumb.display = False
            return
        path, frames = worker.result
        if path != self.thumb_path:  # the selection moved on meanwhile
            return
        self.thumb.border_title = plain(f"output · {path.name}")
        self.thumb.update(HalfBlockImage(frames.main))
        self.thumb.display = True

    def _table(self) -> Any:
        return history_table(self.entries, self.selected if self.entries else None)

    def action_select(self, delta: int) -> None:
        if self.entries:
            self.selected = max(0, min(len(self.entries) - 1, self.selected + delta))
            self.query_one("#history-rows", Static).update(self._table())
            self._load_thumb()

    def action_rerun(self) -> None:
        if self.entries:
            self.dismiss(self._selected_entry())

    def action_close(self) -> None:
        self.dismiss(None)
