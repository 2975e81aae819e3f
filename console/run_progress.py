"""`run`'s lines on stderr while the engine works, one GPU or a rank group: a line for each event worth one
(with --json too: the document goes to stdout alone), none once Ctrl+C was pressed (the one "interrupted"
line says it all, and comes last). The engine's progress thread (`service.EventDrain`) calls `event`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console

from ..engine import events
from ..engine.api import plain
from .event_text import one_line, progress_line

if TYPE_CHECKING:
    from .interrupts import InterruptGuard

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


class ProgressLines:
    """Prints `line_for(event)` for each event, and the run's own lines, under the guard's output lock (the
    interrupt line is never printed inside another)."""

    def __init__(self, console: Console, guard: InterruptGuard,
                 line_for: Callable[[events.Event], Line | None] = engine_line) -> None:
        self.console, self.guard, self.line_for = console, guard, line_for

    def event(self, event: events.Event) -> None:
        line = self.line_for(event)
        if line is None:
            return
        with self.guard.output_lock:
            if not self.guard.interrupted:
                self.console.print(line[0], style=line[1], markup=False, highlight=False, soft_wrap=True)

    def say(self, text: str) -> None:
        """A line of the run's own (a note, the failure): shown as written, unwrapped."""
        with self.guard.output_lock:
            self.console.print(plain(text), markup=False, highlight=False, soft_wrap=True)
