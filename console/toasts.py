"""Which toasts a new notice replaces, so notices never pile up over the panels' newest lines.

A notice repeated within REPEAT_S (seven presses of `-`) replaces its earlier toast instead of
stacking another, and at most MAX_VISIBLE toasts are shown: the oldest go first, errors last.
Every notice is still kept in the app's `notices` history; only the toasts are coalesced.
Textual-free: it reads only the fields a toast has (message, title, raised_at, timeout, severity).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

MAX_VISIBLE = 2
REPEAT_S = 4.0


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
