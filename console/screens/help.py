"""`?`: every key binding, generated from the bindings themselves so the list cannot go stale."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

Section = tuple[str, list[tuple[str, str]]]


def binding_rows(bindings: Iterable[BindingType], key_display) -> list[tuple[str, str]]:
    """(keys, description) per binding; keys of one binding are joined, actions without text named."""
    rows: list[tuple[str, str]] = []
    for b in Binding.make_bindings(bindings):
        keys = key_display(b)
        text = b.tooltip or b.description or b.action.replace("_", " ")
        if rows and rows[-1][1] == text:  # "j" and "down" bound separately to one action
            rows[-1] = (f"{rows[-1][0]} / {keys}", text)
        else:
            rows.append((keys, text))
    return rows


class HelpScreen(ModalScreen[None]):
    """A scrollable table of every binding per screen; esc, q or ? closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 110; height: 90%; border: round $primary; background: $surface; padding: 0 1;
    }
    """

    BINDINGS = [Binding("escape,q,question_mark", "close", "close help", id="help.close")]

    def __init__(self, sections: Sequence[Section]) -> None:
        super().__init__()
        self.sections = list(sections)

    def compose(self) -> ComposeResult:
        with VerticalScroll() as scroll:
            scroll.border_title = "omni-console keys (esc closes)"
            yield Static(self._table(), id="help-table")

    def _table(self) -> Table:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for title, rows in self.sections:
            table.add_row("", "")
            table.add_row(f"[underline]{title}[/]", "")
            for keys, text in rows:
                table.add_row(keys, text)
        return table

    @property
    def text(self) -> str:
        """Plain text of the help (tests read it)."""
        return "\n".join(f"{title}: " + "; ".join(f"{k} {t}" for k, t in rows) for title, rows in self.sections)

    def action_close(self) -> None:
        self.dismiss(None)
