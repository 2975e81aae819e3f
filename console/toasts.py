"""Which toasts a new notice replaces, so notices never pile up over the panels' newest lines.

A notice repeated within REPEAT_S (seven presses of `-`) replaces its earlier toast instead of
stacking another, and at most MAX_VISIBLE toasts are shown: the oldest go first, errors last.
Every notice is still kept in the app's `notices` history; only the toasts are coalesced.

On a terminal narrower than NARROW_WIDTH (80x24) a toast of 4+ lines in the lower right covered
the plan's forecast and the live memory figures. There a toast is one line over the title bar
(`toast_text`: long words lose their middle, never folded), and only one is shown at a time.
Textual-free at import: it reads only the fields a toast has (message, title, raised_at, timeout,
severity); `drop_toast` alone touches the screen.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from .fit_text import one_line

MAX_VISIBLE = 2
REPEAT_S = 4.0
NARROW_WIDTH = 120
"""Below this many columns the screens are one column and a toast is one line over the title bar."""
TOAST_CHROME = 6
"""Columns a one-line toast spends on its edge, padding and the toast rack's scrollbar gutter."""


class Toast(Protocol):
    message: str
    title: str
    severity: str
    timeout: float
    raised_at: float


T = TypeVar("T", bound=Toast)


def toasts_replaced_by(new: Toast, shown: Iterable[T], *, max_visible: int = MAX_VISIBLE,
                       repeat_s: float = REPEAT_S) -> list[T]:
    """The shown toasts to remove before `new` is shown (repeats of it first, then the overflow)."""
    now = new.raised_at
    live = [t for t in shown if t.raised_at + t.timeout > now]
    repeats = [t for t in live if t.message == new.message and t.title == new.title
               and now - t.raised_at <= repeat_s]
    others = sorted((t for t in live if t not in repeats), key=lambda t: (t.severity == "error", t.raised_at))
    overflow = others[:max(0, len(others) - (max_visible - 1))]
    return repeats + overflow


def max_visible_for(width: int) -> int:
    """Toasts shown at once on a terminal `width` columns wide."""
    return 1 if width < NARROW_WIDTH else MAX_VISIBLE


def toast_text(message: str, width: int) -> str:
    """The toast's text: as given on a wide terminal, one line of the terminal's width on a narrow one."""
    return message if width >= NARROW_WIDTH else one_line(message, max(width - TOAST_CHROME, 12))


def drop_toast(screen: Any, notification: Any) -> None:
    """Remove a replaced toast's holder from `screen` now.

    Textual's toast rack removes a forgotten notification's toast but not the holder it sits in; the
    empty holder keeps its row, so on a narrow terminal each replaced notice pushed the next one a
    line further down, over the status line (where `p` says the log is paused) and then the panels.
    """
    from textual.css.query import NoMatches
    from textual.widgets._toast import ToastRack

    try:
        rack = screen.get_child_by_type(ToastRack)
        holder = rack.get_child_by_id(ToastRack._toast_id(notification))
    except NoMatches:
        return
    holder.remove()
