"""The live staging log: transfers, cache decisions, OOM retries, log lines and errors.

Events are never coalesced: while the operator pauses, new lines are buffered (bounded, overflow
counted) and appear on resume; events the app's subscription dropped are counted in the title via
`set_dropped`.

The log follows the newest line unless the operator scrolled up or paused it, and its title says
which (the lines are a `FollowLog`, follow_log.py).

In a multi-GPU group every rank's lines arrive here, prefixed `r{rank} `; `cycle_rank` narrows the
log to one rank's lines (this process's own lines, with no prefix, are always shown).
"""

from __future__ import annotations

import re
from collections import deque

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.markup import escape
from textual.widgets import Log

from omni_console.console.event_text import format_event

from ...engine import events as engine_events
from .filter_bar import FilterBar
from .follow_log import FollowLog

SHOWN_LINES = 5000
PAUSE_BUFFER = 5000


FOLLOWING = "live"
PAUSED = "paused (p resumes)"
SCROLLED_UP = "scrolled up — End follows again"
RANK_PREFIX = re.compile(r"r(\d+) ")
"""A rank's lines start with `r{rank} `; this process's lines start with their time stamp (`+`)."""


def event_line(event: engine_events.Event, t0: float, *, on_cpu: bool = False) -> str | None:
    """The log line for an event (None: not a staging-log event), prefixed `r{rank} ` when a rank sent it."""
    line = format_event(event, t0, on_cpu=on_cpu)
    rank = getattr(event, "rank", None)
    return line if line is None or rank is None else f"r{rank} {line}"


def line_rank(line: str) -> int | None:
    """The rank that sent a log line; None for this process's own lines."""
    match = RANK_PREFIX.match(line)
    return int(match.group(1)) if match else None


class StagingLog(Vertical):
    """Scrolling event lines with a substring filter, pause/resume and a drop counter.

    The app feeds it (`add_event` / `add_events`), binds `/` to `open_filter()` and a pause
    key to `toggle_pause()`, and passes its subscription's drop count to `set_dropped`.
    `follow_state` is what the title says: live, paused, or scrolled up.
    """

    DEFAULT_CSS = """
    StagingLog { border: round $accent; height: 1fr; min-height: 5; }
    StagingLog.-paused { border: round $warning; }
    StagingLog > Log { height: 1fr; }
    StagingLog > FilterBar { dock: bottom; display: none; }
    StagingLog > FilterBar.-open { display: block; }
    """

    def __init__(
        self,
        *,
        max_lines: int = SHOWN_LINES,
        pause_buffer: int = PAUSE_BUFFER,
        t0: float | None = None,
        on_cpu: bool = False,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self._lines: deque[str] = deque(maxlen=max_lines)
        self._buffer: deque[str] = deque(maxlen=pause_buffer)
        self._t0 = t0
        self.on_cpu = on_cpu  # transfers are host copies: no "GB/s" that would read as link bandwidth
        self._filter = ""
        self._rank: int | None = None
        self._ranked = False  # a multi-GPU group's log: the filter bar says which rank is shown
        self._paused = False
        self._bus_dropped = 0
        self._buffer_dropped = 0
        self._focus_when_composed = False
        self._update_title()

    # ---- composition -----------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield FollowLog(max_lines=self._lines.maxlen)
        yield FilterBar(self._filter, id="staging-filter")

    def on_mount(self) -> None:
        self.call_after_refresh(self._rewrite)  # lines added before mount (is_mounted is False in on_mount)
        if self._focus_when_composed:
            self.query_one(FollowLog).focus()
        if self._ranked:
            self.query_one(FilterBar).show_rank(self._rank)

    def focus_log(self) -> None:
        """Focus the lines: now, or once composed (the screen's on_mount can run before this widget's
        compose under load, and querying the log there crashed the app)."""
        logs = self.query(FollowLog)
        if logs:
            logs.first().focus()
        else:
            self._focus_when_composed = True

    # ---- state the app reads ---------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def follow_state(self) -> str:
        """FOLLOWING, PAUSED or SCROLLED_UP (pause wins: nothing new is shown while paused)."""
        if self._paused:
            return PAUSED
        if self.is_mounted and not self.query_one(FollowLog).following:
            return SCROLLED_UP
        return FOLLOWING

    def follow(self) -> None:
        """Resume following the newest line (what End does in the log)."""
        self.query_one(FollowLog).set_following(True)

    @property
    def filter_text(self) -> str:
        return self._filter

    @property
    def rank_filter(self) -> int | None:
        """The one rank whose lines are shown (None: every rank's)."""
        return self._rank

    @property
    def buffered(self) -> int:
        """Lines waiting for resume."""
        return len(self._buffer)

    @property
    def dropped(self) -> int:
        """Events lost: behind on the bus, or past the pause buffer."""
        return self._bus_dropped + self._buffer_dropped

    @property
    def lines(self) -> list[str]:
        """Every accepted (not buffered) line, filter or not, oldest first."""
        return list(self._lines)

    @property
    def visible_lines(self) -> list[str]:
        """The lines the filter lets through (what the log shows)."""
        return [line for line in self._lines if self._matches(line)]

    # ---- feeding ---------------------------------------------------------------------------

    def add_event(self, event: engine_events.Event) -> bool:
        """Add one event; False when it is not a staging-log event type."""
        if self._t0 is None:
            self._t0 = event.t
        line = event_line(event, self._t0, on_cpu=self.on_cpu)
        if line is None:
            return False
        self.add_line(line)
        return True

    def add_events(self, events: list[engine_events.Event]) -> int:
        """Add a drained batch (one write to the log); returns how many were staging-log events."""
        lines: list[str] = []
        for event in events:
            if self._t0 is None:
                self._t0 = event.t
            line = event_line(event, self._t0, on_cpu=self.on_cpu)
            if line is not None:
                lines.append(line)
        self.add_lines(lines)
        return len(lines)

    def add_line(self, line: str) -> None:
        """Add a preformatted line (paused: buffered)."""
        self.add_lines([line])

    def add_lines(self, lines: list[str]) -> None:
        """Add preformatted lines with a single log write (paused: buffered)."""
        if not lines:
            return
        if self._paused:
            for line in lines:
                if len(self._buffer) == self._buffer.maxlen:
                    self._buffer_dropped += 1
                self._buffer.append(line)
            self._update_title()
            return
        self._lines.extend(lines)
        if self.is_mounted:
            self._write([line for line in lines if self._matches(line)])

    def set_dropped(self, n: int) -> None:
        """The app's subscription drop count (events lost before reaching this widget)."""
        if n != self._bus_dropped:
            self._bus_dropped = n
            self._update_title()

    def clear(self) -> None:
        self._lines.clear()
        self._buffer.clear()
        self._buffer_dropped = 0
        self._rewrite()
        self._update_title()

    # ---- filter ----------------------------------------------------------------------------

    def _matches(self, line: str) -> bool:
        if self._rank is not None and line_rank(line) not in (None, self._rank):
            return False
        return not self._filter or self._filter.casefold() in line.casefold()

    def set_rank_filter(self, rank: int | None) -> None:
        """Show only rank `rank`'s lines (and this process's); None shows every rank's."""
        if rank == self._rank:
            return
        self._rank = rank
        self._ranked = True
        if self.is_mounted:
            self.query_one(FilterBar).show_rank(rank)
        self._rewrite()
        self._update_title()

    def enable_rank_filter(self) -> None:
        """The log of a multi-GPU group: the filter bar says `rank: all` until `cycle_rank` narrows it."""
        self._ranked = True
        if self.is_mounted:
            self.query_one(FilterBar).show_rank(self._rank)

    def cycle_rank(self, world: int) -> int | None:
        """all → rank 0 → rank 1 → … → rank world-1 → all; returns the new rank filter."""
        if self._rank is None:
            rank: int | None = 0
        else:
            rank = self._rank + 1 if self._rank + 1 < world else None
        self.set_rank_filter(rank)
        return rank

    def set_filter(self, text: str) -> None:
        """Show only lines containing `text` (case-insensitive); "" shows all."""
        text = text.strip()
        if text == self._filter:
            return
        self._filter = text
        self._rewrite()
        self._update_title()

    def open_filter(self) -> None:
        """Show and focus the filter bar (bind `/` to this)."""
        bar = self.query_one(FilterBar)
        bar.add_class("-open")
        bar.focus()

    def close_filter(self) -> None:
        bar = self.query_one(FilterBar)
        bar.remove_class("-open")
        self.query_one(Log).focus()

    def on_follow_log_follow_changed(self, message: FollowLog.FollowChanged) -> None:
        message.stop()
        self._update_title()

    def on_filter_bar_filter_changed(self, message: FilterBar.FilterChanged) -> None:
        message.stop()
        self.set_filter(message.text)

    def on_filter_bar_closed(self, message: FilterBar.Closed) -> None:
        message.stop()
        self.close_filter()

    # ---- pause -----------------------------------------------------------------------------

    def toggle_pause(self) -> bool:
        """Pause or resume; returns the new paused state."""
        self.set_paused(not self._paused)
        return self._paused

    def set_paused(self, paused: bool) -> None:
        if paused == self._paused:
            return
        self._paused = paused
        self.set_class(paused, "-paused")
        if not paused:
            pending = list(self._buffer)
            self._buffer.clear()
            self._lines.extend(pending)
            if self.is_mounted:
                self._write([line for line in pending if self._matches(line)])
                self.query_one(FollowLog).set_following(True)
        self._update_title()

    # ---- rendering -------------------------------------------------------------------------

    def _write(self, lines: list[str]) -> None:
        if not lines:
            return
        log = self.query_one(FollowLog)
        log.write_lines(lines, scroll_end=False)
        if log.following:
            log.follow_newest()

    def _rewrite(self) -> None:
        if not self.is_mounted:
            return
        log = self.query_one(FollowLog)
        log.clear()
        self._write(self.visible_lines)

    def _update_title(self) -> None:
        state = self.follow_state
        resume_hint = state == PAUSED and bool(self._buffer)  # said last, after the counts
        if resume_hint:
            state = f"paused ({len(self._buffer)} buffered)"
        title = f"staging events — {state}"
        if self._rank is not None:
            title += f" · rank {self._rank}"
        if self._filter:
            title += f" · filter “{escape(self._filter)}”"  # user text, not markup
        if self.dropped:
            title += f" · {self.dropped} dropped"
        if resume_hint:
            title += " · p resumes"
        self.border_title = title
