"""Ctrl+C for headless work: one line, exit 130, memory released — every time.

Python turns SIGINT into a KeyboardInterrupt raised wherever the main thread happens to be; inside
a library (safetensors, diffusers' loaders) that exception can be caught and re-raised as
something else ("corrupt model"), or swallowed. So while headless work runs, SIGINT never raises:

- the engine's work runs on a worker thread while the main thread only waits;
- the first SIGINT prints the one line (`exit_signals.line`: `omni-console: interrupted (SIGINT); …`,
  saying whether the output is complete or nothing was written) and sets a cancel event that the engine
  checks at its safe points (between components and blocks while loading, at each step end
  while generating);
- whatever the worker then ends with — a result, LoadCancelled, any other exception — the outcome
  is `Interrupted` (exit 130), and the caller releases memory;
- a second SIGINT exits at once with 130 (the operator does not want to wait for a safe point).

While the output is written the engine's `SignalGuard` takes SIGINT over (the handler yields to it), so
a Ctrl+C then removes what was being written, or waits until it is complete: never half of it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

EXIT_INTERRUPTED = 130
INTERRUPTED_LINE = "omni-console: interrupted"  # the line's start; `exit_signals.line` says the rest

T = TypeVar("T")


class Interrupted(BaseException):
    """The operator pressed Ctrl+C; the line is already printed (BaseException: no `except Exception`
    on the way out may swallow it)."""


class InterruptGuard:
    """Installs the SIGINT handler for its `with` block (main thread only) and runs work off it."""

    def __init__(self, poll_s: float = 0.1) -> None:
        self.cancel = threading.Event()
        self.poll_s = poll_s
        self._interrupted = False
        self._announced = False
        self._previous: Any = None
        self._installed = False
        # held by whoever writes progress to stderr: the one line is always the last, never mid-batch
        self.output_lock = threading.Lock()

    @property
    def interrupted(self) -> bool:
        return self._interrupted

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def __exit__(self, *_: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _on_sigint(self, _signum: int, _frame: FrameType | None) -> None:
        if self._interrupted:  # the second Ctrl+C: do not wait for a safe point
            from ..engine.api import writes

            self._announce()
            writes.remove_pending()
            os._exit(EXIT_INTERRUPTED)
        self._interrupted = True
        self.cancel.set()
        self._announce()

    _on_sigint.yields_to_guard = True  # type: ignore[attr-defined]  # a write's SignalGuard takes SIGINT over

    def interrupt(self) -> None:
        """What the first SIGINT does (also for callers that learn of an interrupt otherwise)."""
        self._on_sigint(signal.SIGINT, None)

    def _announce(self) -> None:
        if self._announced:
            return
        self._announced = True
        from .exit_signals import say

        with self.output_lock:  # a progress line being printed finishes first; none follows (muted)
            say(signal.SIGINT)

    def check(self) -> None:
        """Raise Interrupted if Ctrl+C was pressed (between phases)."""
        if self._interrupted:
            raise Interrupted

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Call `fn(*args)` on a worker thread and wait; Interrupted if Ctrl+C came meanwhile,
        whatever `fn` returned or raised."""
        self.check()
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                outcome["value"] = fn(*args)
            except BaseException as exc:  # handed to the waiting thread below
                outcome["error"] = exc
            finally:
                done.set()

        worker = threading.Thread(target=work, name="omni-headless-work", daemon=True)
        worker.start()
        while not done.wait(self.poll_s):  # short waits: the handler runs promptly on the main thread
            pass
        worker.join()
        self.check()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]
