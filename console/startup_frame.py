"""The console's first frame, drawn before torch, the model and Textual have loaded.

Starting the console costs seconds before Textual can draw anything (importing torch alone is 2–6 s
on a small machine, then the model is read and the app built); the terminal used to stay blank all
that time. This frame is written to the terminal's alternate screen with plain escape sequences as
soon as the flags are parsed (no Textual, no torch): a title bar with the model, one line per
start-up step that is ticked with its time as it ends, and a footer. Textual then takes over the
same alternate screen and draws the app over it, so there is no flash of the shell in between.

Ctrl+C, SIGTERM and SIGHUP while it is shown (`exit_signals`: the frame's `close` runs before the
process ends), or an error in a step (a bad flag or model folder: one line, exit 2 as always), restore
the terminal (main screen, cursor, echo) before the line is printed; a terminal that hung up is skipped.
Typed keys are not echoed over the frame; they reach the app once it runs (`q` quits it).
Nothing is drawn when stdout is not a terminal.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from typing import TextIO

from ..engine.api import plain
from .exit_signals import add_stop_hook, remove_stop_hook

try:
    from termios import error as _TermiosError
except ImportError:  # no termios (Windows): nothing raises it
    class _TermiosError(Exception):  # type: ignore[no-redef]
        pass

ENTER = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J"  # alternate screen, cursor hidden, cleared
LEAVE = "\x1b[?25h\x1b[?1049l"  # cursor shown, main screen back
BAR = "\x1b[7m{}\x1b[0m"  # reverse video: the title bar and the footer


class StartupFrame:
    """Draws the frame on a terminal (a no-op otherwise); `step` names what is loading now."""

    def __init__(self, model: str, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.model = plain(model)
        self.active = _is_terminal(self.stream)
        self.steps: list[tuple[str, float | None]] = []
        self._started = 0.0
        self._termios: tuple[int, list] | None = None

    def open(self) -> None:
        if not self.active:
            return
        self._quiet_keys()
        add_stop_hook(self.close)
        self._write(ENTER)
        self._draw()

    def step(self, text: str) -> None:
        """The previous step is done (its time shown); `text` is loading now."""
        now = time.perf_counter()
        if self.steps and self.steps[-1][1] is None:
            self.steps[-1] = (self.steps[-1][0], now - self._started)
        self.steps.append((text, None))
        self._started = now
        if self.active:
            self._draw()

    def hand_over(self) -> None:
        """Textual takes the terminal next: keys and signals back as they were, the frame left on screen."""
        self._restore_keys()
        remove_stop_hook(self.close)

    def close(self) -> None:
        """Put the terminal back (an error or an interrupt before the app ran)."""
        if not self.active:
            return
        self.hand_over()
        self._write(LEAVE)
        self.active = False

    def lines(self, width: int, height: int) -> list[str]:
        """The frame's text, one entry per terminal row (titles without their colour)."""
        title = f" omni-console — {self.model}"
        rows = [title[:width].ljust(width), "", " starting the console:"]
        for text, seconds in self.steps:
            mark, done = ("✓", f" ({seconds:.2f} s)") if seconds is not None else ("…", "")
            rows.append(f"   {mark} {text}{done}"[:width])
        body = rows[: max(height - 1, 1)]
        body += [""] * (height - 1 - len(body))
        return [*body, " ctrl+c quit"[:width].ljust(width)]

    def _draw(self) -> None:
        size = shutil.get_terminal_size((80, 24))
        rows = self.lines(size.columns, size.lines)
        out = [f"\x1b[{i + 1};1H\x1b[2K{BAR.format(row) if i in (0, len(rows) - 1) else row}"
               for i, row in enumerate(rows)]
        self._write("".join(out))

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(text)
            self.stream.flush()

    def _quiet_keys(self) -> None:
        """No echo of typed keys over the frame (Ctrl+C still interrupts)."""
        try:
            import termios

            fd = sys.stdin.fileno()
            saved = termios.tcgetattr(fd)
            quiet = termios.tcgetattr(fd)
            quiet[3] &= ~(termios.ECHO | termios.ICANON)
            termios.tcsetattr(fd, termios.TCSANOW, quiet)
            self._termios = (fd, saved)
        except (ImportError, OSError, ValueError, AttributeError, _TermiosError):
            self._termios = None

    def _restore_keys(self) -> None:
        if self._termios is not None:
            import termios

            with contextlib.suppress(OSError, ValueError, termios.error):  # a hung-up terminal: nothing to restore
                termios.tcsetattr(self._termios[0], termios.TCSANOW, self._termios[1])
            self._termios = None


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and sys.stdin.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def startup_frame(model: str, stream: TextIO | None = None) -> Iterator[StartupFrame]:
    """The frame while the block runs; the terminal is put back if the block raises (the app never ran)."""
    frame = StartupFrame(model, stream)
    frame.open()
    try:
        yield frame
    except BaseException:
        frame.close()
        raise
    frame.hand_over()
