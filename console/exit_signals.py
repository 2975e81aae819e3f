"""One rule for every signal at every moment of a command: one line, the conventional code, all or nothing.

SIGINT exits 130, SIGTERM 143, SIGHUP 129 (128 + the signal's number, what a shell reports), with one
line on stderr that names the signal and what is left:

    omni-console: interrupted (SIGTERM); nothing written
    omni-console: interrupted (SIGINT); output complete: out.png

An output is never left half-written: before it is complete nothing of it is left (temporary files and
scratch folders are removed), after it is complete all of it is (`engine/running/signal_guard.py`: putting
an output in place is a step that signals wait for, and it records what it completed).

`install()` is the first thing `main()` does, before torch or diffusers is imported: a signal during the
imports or anywhere outside a write removes what is pending, prints the line and ends the process at
once with `os._exit` (raising inside torch's import can leave it half-initialised and abort at exit;
the OS frees the memory of an ended process). Inside a write or a build the engine's `SignalGuard` takes
over and unwinds instead, and `run` turns the first Ctrl+C during load and generation into a cancel
(`interrupts.InterruptGuard`); both end with the same line and code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
_stop_hooks: list[Callable[[], None]] = []


def exit_code(signum: int) -> int:
    return 128 + signum


CONSOLE_OUTCOME = "every saved output is complete, nothing half-written is left"


def line(signum: int, outcome: str | None = None) -> str:
    """The one line for `signum` now: the signal and whether the output is complete or nothing was written
    (`outcome`: what to say instead, for the console, whose saves are many)."""
    from ..engine.api import plain, writes

    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if outcome is not None:
        return f"omni-console: interrupted ({name}); {outcome}"
    done = writes.completed_outputs()
    if not done:
        return f"omni-console: interrupted ({name}); nothing written"
    shown = plain(str(done[0])) if len(done) == 1 else \
        f"{plain(str(done[0]))} … {plain(str(done[-1]))} ({len(done)} files)"
    return f"omni-console: interrupted ({name}); output complete: {shown}"


def say(signum: int, outcome: str | None = None) -> None:
    """Print the line (never raising: a closed stderr must not turn into a traceback)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line(signum, outcome) + "\n")
        sys.stderr.flush()


def stop(signum: int, _frame: FrameType | None = None) -> NoReturn:
    """End the process now: put the terminal back, remove unfinished files, say the line, exit 128 + signum."""
    from ..engine.api import writes

    for hook in list(_stop_hooks):
        with contextlib.suppress(Exception):
            hook()
    writes.remove_pending()
    _end_children()
    say(signum)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(exit_code(signum))


def _end_children() -> None:
    """Rank processes (`run --gpus`) go with this one: `os._exit` skips multiprocessing's own clean-up."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return
    with contextlib.suppress(Exception):
        for child in mp.active_children():
            child.kill()


def end(code: int) -> NoReturn:
    """End the command line's process with `code` once its work is done, without the interpreter's teardown:
    during that teardown (over a second with torch loaded) Python puts the default handlers back, and a
    signal then killed the process with no line, after its output was complete."""
    _end_children()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def add_stop_hook(hook: Callable[[], None]) -> None:
    """Run `hook` (e.g. give the terminal back) before the process ends on a signal."""
    _stop_hooks.append(hook)


def remove_stop_hook(hook: Callable[[], None]) -> None:
    with contextlib.suppress(ValueError):
        _stop_hooks.remove(hook)


def install_early() -> None:
    """The rule's handlers from the console script's first import on (before `main()` runs), so a signal
    during the imports is one line too; `installed()` then takes over for `main()`."""
    from ..engine.api import writes

    handler = writes.deferrable(stop)
    for signum in SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, handler)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The rule's handlers for the block (main thread only; the previous ones come back afterwards)."""
    from ..engine.api import writes

    writes.forget_outputs()
    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        handler = writes.deferrable(stop)
        for signum in SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup's choice stays
                previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
