"""Per-component load progress (bytes done / total) from the engine's LoadProgress events."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, ProgressBar

from ...engine import events
from ...engine.api import plain
from ...offload.units import format_bytes


def _row_id(name: str) -> str:
    return "lp-" + "".join(ch if ch.isalnum() else "-" for ch in name)


class LoadProgressPanel(Vertical):
    """One labelled ProgressBar per component, added as the engine first reports it."""

    DEFAULT_CSS = """
    LoadProgressPanel { height: auto; border: round $accent; padding: 0 1; }
    LoadProgressPanel > Horizontal { height: auto; }
    LoadProgressPanel .lp-label { width: 1fr; height: auto; }
    LoadProgressPanel ProgressBar { width: auto; margin-left: 1; }
    LoadProgressPanel ProgressBar Bar { width: 16; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "loading — esc cancels"
        self.progress: dict[str, tuple[int, int, str]] = {}
        self._rows: dict[str, tuple[Horizontal, Label, ProgressBar]] = {}

    def compose(self) -> ComposeResult:
        yield Label("waiting for the engine…", id="lp-status")

    def reset(self) -> None:
        """Hide every row for the next load; rows are reused by component name, never re-mounted
        (a removal finishes asynchronously, so re-mounting the same id on a quick retry collides)."""
        self.progress.clear()
        for row, _text, bar in self._rows.values():
            row.display = False
            bar.update(progress=0)
        self.query_one("#lp-status", Label).update("waiting for the engine…")

    def set_status(self, text: str) -> None:
        self.query_one("#lp-status", Label).update(Text(plain(text)))

    def add_progress(self, event: events.LoadProgress) -> None:
        """Create or advance the component's bar; weightless components (tokenizers) get none."""
        if event.total_bytes <= 0:
            return
        name = event.component
        phase = {"host": "read from disk", "place": "placed"}.get(event.phase, event.phase)
        self.progress[name] = (event.done_bytes, event.total_bytes, phase)
        label = f"{name} · {phase} · {format_bytes(event.done_bytes)} / {format_bytes(event.total_bytes)}"
        if name in self._rows:
            row, text, bar = self._rows[name]
            row.display = True
            text.update(Text(plain(label)))
        else:
            text = Label(Text(plain(label)), classes="lp-label")
            bar = ProgressBar(total=event.total_bytes, show_eta=False)
            row = Horizontal(text, bar, id=_row_id(name))
            self._rows[name] = (row, text, bar)
            self.mount(row)
        bar.update(total=event.total_bytes, progress=event.done_bytes)
