"""`n`: every notice of the session with the time it was given, newest last.

A toast lasts seconds, at most two are shown (one on a narrow terminal) and a repeated notice replaces
the last: what a toast said is often gone before it is read. The app keeps every notice (already made
plain: controls escaped), and this screen lists them whole; Esc, Enter or n closes it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow"}


def notice_rows(notices: Sequence[tuple[str, str]], times: Sequence[float]) -> Text:
    """One entry per notice: `HH:MM:SS severity` then the message, its later lines indented."""
    text = Text()
    if not notices:
        return Text("no notices yet")
    for (message, severity), at in zip(notices, times, strict=True):
        if text:
            text.append("\n")
        text.append(time.strftime("%H:%M:%S", time.localtime(at)) + " ", style="dim")
        text.append(f"{severity:<11} ", style=SEVERITY_STYLE.get(severity, ""))
        text.append(message.replace("\n", "\n" + " " * 21))
    return text


class NoticeLogScreen(ModalScreen[None]):
    """The session's notices, scrollable; opened at the newest."""

    DEFAULT_CSS = """
    NoticeLogScreen { align: center middle; }
    NoticeLogScreen > VerticalScroll {
        width: 95%; height: 90%; border: round $primary; background: $surface; padding: 0 1;
    }
    """

    BINDINGS = [Binding("escape,enter,n", "close", "close", id="notices.close")]

    def __init__(self, notices: Sequence[tuple[str, str]], times: Sequence[float]) -> None:
        super().__init__()
        self.notices, self.times = list(notices), list(times)

    def compose(self) -> ComposeResult:
        with VerticalScroll() as scroll:
            scroll.border_title = f"notices ({len(self.notices)}, newest last; esc closes)"
            yield Static(notice_rows(self.notices, self.times), id="notice-rows")

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).scroll_end(animate=False)

    def action_close(self) -> None:
        self.dismiss(None)
