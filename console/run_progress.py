"""`run`'s progress on stderr while the engine works, one GPU or a rank group: one thread drains the
engine's bus, prints a line for each event worth one (with --json too: the document goes to stdout
alone) and folds every event into bounded running totals for the report."""

from __future__ import annotations

import threading
from collections.abc import Callable

from rich.console import Console

from ..engine import events
from ..engine.api import service
from .event_text import one_line, progress_line

Line = tuple[str, str]  # (text, style)


def engine_line(event: events.Event) -> Line | None:
    """One GPU's line: every progress line but a failure's (the run ends with its own one line, never several)."""
    if isinstance(event, events.ErrorEvent) or (isinstance(event, events.EngineStateChanged) and event.new == "failed"):
        return None
    line = progress_line(event)
    return None if line is None else (one_line(line[0]), line[1])


def rank_line(event: events.Event) -> Line | None:
    """A rank group's line: each rank's own events, as `[rank N] …` (its failure too: which rank said
    what); the leader's events (no rank: the group's state, its summaries) are not printed."""
    if event.rank is None:
        return None
    line = progress_line(event)
    return None if line is None else (f"[rank {event.rank}] {line[0]}", line[1])


class RunProgress(threading.Thread):
    """Prints `line_for(event)` to `console` for each event on `sub` until `stop`, then the rest; nothing
    once `muted` (after Ctrl+C the one "interrupted" line says it all). Join it before a failure's line,
    which must be the last."""

    def __init__(self, sub: events.Subscription, console: Console, muted: Callable[[], bool] = lambda: False,
                 lock: threading.Lock | None = None,
                 line_for: Callable[[events.Event], Line | None] = engine_line) -> None:
        super().__init__(daemon=True, name="omni-progress")
        self.sub, self.console, self.muted, self.line_for = sub, console, muted, line_for
        self.lock = lock or threading.Lock()  # shared with the interrupt line, which must come last
        self.stop = threading.Event()
        self.totals = service.RunTotals()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self._flush()
        self._flush()

    def finish(self) -> None:
        """Print what is left and end: every line of the work so far is out when this returns."""
        self.stop.set()
        self.join()

    def _flush(self) -> None:
        for event in self.sub.drain():
            self.totals.add(event)
            line = self.line_for(event)
            if line is None:
                continue
            with self.lock:
                if self.muted():
                    continue
                self.console.print(line[0], style=line[1], markup=False, highlight=False, soft_wrap=True)
