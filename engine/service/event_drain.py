"""A run's progress: one thread drains the engine's bus while the run works, folds every event into bounded
running totals (the report's) and hands each event to the face, which prints what it wants of it.

Drained apart from the work, so a slow terminal never slows a step; the totals stay bounded however long
the run (`RunTotals`)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from .. import events
from .run_totals import RunTotals


class EventDrain(threading.Thread):
    """Folds each event on `sub` into `totals` and calls `on_event` with it, until `finish`."""

    def __init__(self, sub: events.Subscription, on_event: Callable[[events.Event], None] = lambda _: None,
                 poll_s: float = 0.1) -> None:
        super().__init__(daemon=True, name="omni-progress")  # the name tests look for after a run
        self.sub, self.on_event, self.poll_s = sub, on_event, poll_s
        self.stop = threading.Event()
        self.totals = RunTotals()

    def run(self) -> None:
        while not self.stop.wait(self.poll_s):
            self._flush()
        self._flush()

    def finish(self) -> None:
        """Hand on what is left and end: every event of the work so far is out when this returns (a face
        prints its failure line after it, as the last)."""
        self.stop.set()
        if self.is_alive():
            self.join()

    def _flush(self) -> None:
        for event in self.sub.drain():
            self.totals.add(event)
            self.on_event(event)
