"""The console's first frames, read as a terminal shows them: the start-up frame, then the app painted
once it has settled, never a screen that is still being laid out.

The real CLI runs on an 80x24 pty (`pty_cli`) that answers Textual's query for synchronized output, so
each of Textual's frames is delimited (`ESC[?2026h` … `ESC[?2026l`), as on the terminals that support
it. A small screen model below replays the byte stream frame by frame. Before console/first_paint.py the
first three frames each differed from the settled screen: the start-up frame's title showing through
the header's icon cells, a header line wrapped inside `(24.5 GB available)` and re-wrapped, the
component table one column narrower until the body's scrollbar was laid out, the footer's keys in
another order, and the start-up footer's `q` left between two keys.
"""

from __future__ import annotations

import os
import re
import time

import pytest
from pty_cli import Pty

SYNC_QUERY, SYNC_ANSWER = b"\x1b[?2026$p", b"\x1b[?2026;2$y"  # DECRQM: supported, off
FRAME_END = b"\x1b[?2026l"
ROWS, COLS = 24, 80
_TOKEN = re.compile(r"\x1b\[([?>]?)([0-9;]*)([ -/]*)([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[=>78]|(.)", re.S)


class Screen:
    """The cells a VT100 shows after cursor moves, erases and text (colours and modes are ignored)."""

    def __init__(self) -> None:
        self.cells = [[" "] * COLS for _ in range(ROWS)]
        self.row = self.col = 0

    def feed(self, text: str) -> None:
        for m in _TOKEN.finditer(text):
            char = m[5]
            if char is not None:
                self._char(char)
            elif m[4] is not None and not m[1] and not m[3]:
                self._csi(m[4], [int(n) if n else 0 for n in m[2].split(";")] if m[2] else [])

    def _char(self, char: str) -> None:
        if char == "\r":
            self.col = 0
        elif char == "\n":
            self.row = min(self.row + 1, ROWS - 1)
        elif char >= " ":
            if self.col < COLS:
                self.cells[self.row][self.col] = char
            self.col += 1

    def _csi(self, final: str, args: list[int]) -> None:
        if final in "Hf":
            row, col = (args + [1, 1])[:2] if args else (1, 1)
            self.row, self.col = min(max(row, 1), ROWS) - 1, min(max(col, 1), COLS) - 1
        elif final == "J" and args[:1] == [2]:
            self.cells = [[" "] * COLS for _ in range(ROWS)]
        elif final == "K":
            mode = args[0] if args else 0
            start, end = {0: (self.col, COLS), 1: (0, self.col + 1), 2: (0, COLS)}[mode]
            for c in range(start, min(end, COLS)):
                self.cells[self.row][c] = " "
        elif final in "ABCDG":
            n = max(args[0] if args else 1, 1)
            if final == "A":
                self.row = max(self.row - n, 0)
            elif final == "B":
                self.row = min(self.row + n, ROWS - 1)
            elif final == "C":
                self.col = min(self.col + n, COLS - 1)
            elif final == "D":
                self.col = max(self.col - n, 0)
            else:
                self.col = min(n, COLS) - 1

    def lines(self) -> list[str]:
        return ["".join(row) for row in self.cells]


def app_frames(out: bytes) -> tuple[list[str], list[list[str]]]:
    """(the screen before the app's first frame, the screen after each of the app's frames)."""
    text = out.decode("utf-8", "replace")
    screen = Screen()
    head, *frames = text.split(FRAME_END.decode().replace("l", "h"))  # each frame starts ESC[?2026h
    screen.feed(head)
    before = screen.lines()
    shown = []
    for frame in frames:
        body, sep, rest = frame.partition(FRAME_END.decode())
        screen.feed(body)
        if sep:
            shown.append(screen.lines())
        screen.feed(rest)
    return before, shown


def _masked(lines: list[str]) -> list[str]:
    """Live figures (host RAM available, times) change between frames: their digits are not compared."""
    return [re.sub(r"\d", "#", line) for line in lines]


@pytest.mark.slow
def test_the_app_is_painted_once_settled_over_the_startup_frame(demo_model_dir):
    term = Pty("--model", str(demo_model_dir))
    term.wait_for(SYNC_QUERY)
    os.write(term.master, SYNC_ANSWER)  # Textual now brackets each frame
    term.wait_for(FRAME_END)
    time.sleep(1.0)  # the first second of the app
    term.wait_for(FRAME_END, limit_s=60, count=2)  # and a repaint after it, however slow the machine
    os.write(term.master, b"q")
    code, out, echo = term.finish()
    assert code == 0 and echo
    before, frames = app_frames(out[: out.rfind(b"\x1b[?1049l")])
    assert "starting the console:" in "\n".join(before)  # the start-up frame was on screen until then
    assert len(frames) >= 2, len(frames)
    first, settled = frames[0], frames[-1]
    text = "\n".join(first)
    # the first frame is the whole app: nothing of the start-up frame shows through
    assert "starting the console" not in text and "ctrl+c quit" not in text, text
    assert "omni-console" in first[0] and "? help" in first[-1], text
    assert first[-1].split() == settled[-1].split(), (first[-1], settled[-1])  # the footer's keys stay put
    # and it is the settled screen: later frames change live figures only, never where a line is
    for n, frame in enumerate(frames[1:], 1):
        moved = [r for r, (a, b) in enumerate(zip(_masked(first), _masked(frame), strict=True)) if a != b]
        assert not moved, (n, [(first[r], frame[r]) for r in moved])
    # one alternate screen, cleared once (by the start-up frame), the cursor hidden until the app ends
    app_part = out[: out.rfind(b"\x1b[?1049l")]
    assert app_part.count(b"\x1b[2J") == 1 and b"\x1b[?25h" not in app_part
