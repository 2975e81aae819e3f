"""Let a critical file operation clean up when the process is asked to stop (SIGTERM, SIGHUP, Ctrl-C).

Python's default SIGTERM and SIGHUP dispositions kill the process at once, so no ``finally`` runs and
a temp file or folder would be left behind. Inside ``SignalGuard`` SIGTERM raises ``SignalStop``
(a ``SystemExit(143)``; 143 = 128 + 15, what a shell reports for a process ended by SIGTERM), SIGHUP (a
closed terminal or ssh session) ``SignalStop`` with 129, and SIGINT raises ``KeyboardInterrupt``; all
unwind through the caller's ``finally``. ``held()`` delays every signal handler of this process
(the guard's and those made with ``deferrable``) across a step that must not stop half-way (a rename
pair, publishing a sequence's frames), delivering them right after.

So a signal never leaves half an output: before an output is complete nothing of it is left, after it
is complete all of it is. ``mark_complete`` records what was put in place (inside the held step), so
whoever says the one line on the way out can say which of the two it was.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["EXIT_TERMINATED", "PAUSE_ENV", "SignalGuard", "SignalStop", "completed_outputs", "deferrable",
           "forget_outputs", "held", "mark_complete", "pause_point"]

EXIT_TERMINATED = 128 + signal.SIGTERM
"""Exit status after a SIGTERM inside a guard (143), once the ``finally`` blocks have run."""

PAUSE_ENV = "OMNI_CONSOLE_TEST_PAUSE"
"""`MOMENT=FLAG`: at `pause_point(MOMENT)` the process creates FLAG and waits while it exists (at most
PAUSE_MAX_S), so a test can send a signal at exactly that moment; unset, a pause point does nothing."""
PAUSE_MAX_S = 120.0

_holding = 0
_pending: list[tuple[Callable[[int, FrameType | None], Any], int]] = []
_completed: list[Path] = []


class SignalStop(SystemExit):
    """SIGTERM or SIGHUP inside a guard: exits with 128 + the signal's number once ``finally`` blocks ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def pause_point(moment: str) -> None:
    """A named moment tests can stop the process at (`PAUSE_ENV`); signals are handled while it waits."""
    name, _, flag = os.environ.get(PAUSE_ENV, "").partition("=")
    if name != moment or not flag:
        return
    with open(flag, "w") as stream:
        stream.write(moment)
    deadline = time.monotonic() + PAUSE_MAX_S
    while os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)


def mark_complete(paths: Sequence[Path]) -> None:
    """Record outputs that are now complete under their final names (call it inside ``held()``)."""
    _completed.extend(paths)


def completed_outputs() -> list[Path]:
    """The outputs this process has completed since ``forget_outputs`` (for the line a signal prints)."""
    return list(_completed)


def forget_outputs() -> None:
    """Start a new command: nothing of it is complete yet."""
    _completed.clear()


def _deliver_pending() -> None:
    while _pending and not _holding:
        handler, signum = _pending.pop(0)
        handler(signum, None)


@contextmanager
def held() -> Iterator[None]:
    """Hold back every deferrable handler (and the guards') for a step that must not stop half-way."""
    global _holding
    _holding += 1
    try:
        yield
    finally:
        _holding -= 1
        if not _holding:
            _deliver_pending()


def deferrable(handler: Callable[[int, FrameType | None], Any]) -> Callable[[int, FrameType | None], Any]:
    """`handler`, waiting while a step is ``held()``; a ``SignalGuard`` may take its place for a write."""

    def handle(signum: int, frame: FrameType | None) -> Any:
        if _holding:
            _pending.append((handler, signum))
            return None
        return handler(signum, frame)

    handle.yields_to_guard = True  # type: ignore[attr-defined]
    return handle


class SignalGuard:
    """During a build or a write, SIGTERM / SIGHUP / SIGINT raise (``finally`` cleans up); in ``held()`` they wait.

    Installed only in the main thread and only over the default dispositions or a handler that yields to it
    (``deferrable``'s, the CLI's interrupt guard): a handler the embedding program set (or SIG_IGN) is its own
    decision and stays. The previous handlers come back on exit.
    """

    _DEFAULTS = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler,
                 **({signal.SIGHUP: signal.SIG_DFL} if hasattr(signal, "SIGHUP") else {})}

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for signum, default in self._DEFAULTS.items():
                current = signal.getsignal(signum)
                if current is default or getattr(current, "yields_to_guard", False):
                    self._previous[signum] = signal.signal(signum, deferrable(self._raise))
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous.clear()

    @staticmethod
    def _raise(signum: int, frame: FrameType | None = None) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SignalStop(signum)

    held = staticmethod(held)
