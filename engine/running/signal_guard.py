"""Let a critical file operation clean up when the process is asked to stop (SIGTERM, SIGHUP, Ctrl-C).

Python's default SIGTERM and SIGHUP dispositions kill the process at once, so no ``finally`` runs and
a temp file or folder would be left behind. Inside ``SignalGuard`` SIGTERM raises ``SystemExit(143)``
instead (143 = 128 + 15, what a shell reports for a process ended by SIGTERM), SIGHUP (a closed
terminal or ssh session) ``SystemExit(129)``, and SIGINT raises ``KeyboardInterrupt`` as usual; all
unwind through the caller's ``finally``. ``held()`` delays them across a step that must
not stop half-way (a rename pair), delivering them right after.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["EXIT_TERMINATED", "SignalGuard"]

EXIT_TERMINATED = 128 + signal.SIGTERM
"""Exit status after a SIGTERM inside a guard (143), once the ``finally`` blocks have run."""


class SignalGuard:
    """During a build or a write, SIGTERM / SIGHUP / SIGINT raise (``finally`` cleans up); in ``held()`` they wait.

    Installed only in the main thread and only over the default dispositions: a handler the embedding
    program set (or SIG_IGN) is its own decision and stays. The previous handlers come back on exit.
    """

    _DEFAULTS = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler,
                 **({signal.SIGHUP: signal.SIG_DFL} if hasattr(signal, "SIGHUP") else {})}

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}
        self._holding = 0
        self._pending: int | None = None

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for signum, default in self._DEFAULTS.items():
                if signal.getsignal(signum) is default:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._holding:
            self._pending = signum
            return
        self._raise(signum)

    @staticmethod
    def _raise(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold signals back for a step that must not stop half-way; deliver them right after."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
            if not self._holding and self._pending is not None:
                signum, self._pending = self._pending, None
                self._raise(signum)
