"""The live staging log: transfers, cache decisions, OOM retries, log lines and errors.

Events are never coalesced (design.md §3): while the operator pauses, new lines are buffered
(bounded, overflow counted) and appear on resume; events the app's subscription dropped are
counted in the title via `set_dropped`.
"""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.markup import escape
from textual.widgets import Log

from omni_console.offload.events import CacheDecision, ErrorEvent, Event, LogEvent, OomRetry, StagingEvent
from omni_console.offload.telemetry import format_bytes

from .filter_bar import FilterBar

SHOWN_LINES = 5000
PAUSE_BUFFER = 5000


def format_event(event: Event, t0: float = 0.0) -> str | None:
    """One log line for an event the staging log shows; None for other event types."""
    ts = f"+{event.t - t0:9.3f}s"
    if isinstance(event, StagingEvent):
        rate = f"{event.gbps:6.1f} GB/s" if event.seconds > 0 else "     n/a GB/s"
        sync = "  SYNC" if event.sync else ""
        return (
            f"{ts} {event.direction.upper()} {event.target}  {format_bytes(event.nbytes)}"
            f"  {event.seconds:.4f} s  {rate}{sync}"
        )
    if isinstance(event, CacheDecision):
        nums = [
            f"{name} {format_bytes(value)}"
            for name, value in (
                ("reserved", event.reserved),
                ("allocated", event.allocated),
                ("cached", event.cached),
                ("free", event.free),
                ("total", event.total),
            )
            if value is not None
        ]
        forced = " (forced)" if event.forced else ""
        context = getattr(event, "context", "")  # newer events say which boundary asked
        if context:
            forced += f" {context}"
        return f"{ts} CACHE {event.action}{forced}: {event.reason}" + (
            f"  [{', '.join(nums)}]" if nums else ""
        )
    if isinstance(event, OomRetry):
        msg = f": {event.message}" if event.message else ""
        size = format_bytes(event.nbytes)
        return f"{ts} OOM {event.component} {size} — cache released, attempt {event.attempt}{msg}"
    if isinstance(event, LogEvent):
        return f"{ts} {event.level.upper()} {event.message}"
    if isinstance(event, ErrorEvent):
        return f"{ts} ERROR {event.where}: {event.message}"
    return None


class StagingLog(Vertical):
    """Scrolling event lines with a substring filter, pause/resume and a drop counter.

    The app feeds it (`add_event` / `add_events`), binds `/` to `open_filter()` and a pause
    key to `toggle_pause()`, and passes its subscription's drop count to `set_dropped`.
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
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self._lines: deque[str] = deque(maxlen=max_lines)
        self._buffer: deque[str] = deque(maxlen=pause_buffer)
        self._t0 = t0
        self._filter = ""
        self._paused = False
        self._bus_dropped = 0
        self._buffer_dropped = 0
        self._update_title()

    # ---- composition -----------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Log(max_lines=self._lines.maxlen, auto_scroll=True)
        yield FilterBar(self._filter, id="staging-filter")

    def on_mount(self) -> None:
        self.call_after_refresh(self._rewrite)  # lines added before mount (is_mounted is False in on_mount)

    # ---- state the app reads ---------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def filter_text(self) -> str:
        return self._filter

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

    def add_event(self, event: Event) -> bool:
        """Add one event; False when it is not a staging-log event type."""
        if self._t0 is None:
            self._t0 = event.t
        line = format_event(event, self._t0)
        if line is None:
            return False
        self.add_line(line)
        return True

    def add_events(self, events: list[Event]) -> int:
        """Add a drained batch (one write to the log); returns how many were staging-log events."""
        lines: list[str] = []
        for event in events:
            if self._t0 is None:
                self._t0 = event.t
            line = format_event(event, self._t0)
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
            shown = [line for line in lines if self._matches(line)]
            if shown:
                self.query_one(Log).write_lines(shown)

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
        return not self._filter or self._filter.casefold() in line.casefold()

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
                self.query_one(Log).write_lines([line for line in pending if self._matches(line)])
        self._update_title()

    # ---- rendering -------------------------------------------------------------------------

    def _rewrite(self) -> None:
        if not self.is_mounted:
            return
        log = self.query_one(Log)
        log.clear()
        log.write_lines(self.visible_lines)

    def _update_title(self) -> None:
        title = "staging events — "
        title += f"paused ({len(self._buffer)} buffered)" if self._paused else "live"
        if self._filter:
            title += f" · filter “{escape(self._filter)}”"  # user text, not markup
        if self.dropped:
            title += f" · {self.dropped} dropped"
        self.border_title = title
