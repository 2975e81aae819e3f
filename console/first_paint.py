"""The app's first paint waits until its screen has settled.

Textual painted the plan screen before it had settled: its first three frames (the real CLI in a pty,
80x24) showed the start-up frame's title through cells the header had not drawn yet, a header line
wrapped inside a figure and then re-wrapped, the component table one column narrower and one row
shorter until the body's scrollbar was laid out, and a footer whose keys changed order. Textual's
`batch_update` holds the layout passes too (they run only when a frame is painted), so instead the
app's frames are dropped (`OmniConsoleApp._display` asks `holds`) while layout runs as usual, from the
app's mount until the plan screen shows its request forecast and `SETTLE_S` more has passed (its
layout passes), or at most `SETTLE_LIMIT_S`. The start-up frame stays on screen meanwhile; then the
whole screen is painted, once (tests/console/test_startup_paint.py).
"""

from __future__ import annotations

from typing import Any

from textual.app import App
from textual.screen import Screen

SETTLE_S = 0.15
"""After the forecast is shown: the layout passes that follow it (each ~10-40 ms on a 2-core machine)."""
SETTLE_LIMIT_S = 1.5
"""Past this the screen is painted as it is (a forecast that takes longer shows `forecasting…`)."""


class FirstPaint:
    """Drops the app's frames from `__init__` (call it in `on_mount`) until `settled()`, or the limit."""

    def __init__(self, app: App, settle_s: float = SETTLE_S, limit_s: float = SETTLE_LIMIT_S) -> None:
        self.app = app
        self.held = True
        self._settle_s = settle_s
        self._settling = False
        self._painted = False
        app.set_timer(limit_s, self._release, name="first-paint-limit")

    def holds(self) -> bool:
        """Whether a frame now is dropped (it would show a screen still being laid out)."""
        return self.held

    def first_frame(self, screen: Screen, renderable: Any) -> Any:
        """The first frame after the hold is the whole screen (every cell, over the start-up frame), not the
        widgets that happened to change last."""
        if self._painted or self.held:
            return renderable
        self._painted = True
        try:
            return screen._compositor.render_update(full=True, screen_stack=self.app._background_screens)
        except (AttributeError, TypeError):  # another Textual: its own frame, as before
            return renderable

    def settled(self) -> None:
        """What the first screen shows is in: paint once the layout passes it causes have run."""
        if self.held and not self._settling:
            self._settling = True
            self.app.set_timer(self._settle_s, self._release, name="first-paint-settle")

    def _release(self) -> None:
        if self.held:
            self.held = False
            if self.app.is_running and self.app.screen_stack:  # not during the app's exit (no screen left)
                self.app.screen.refresh()  # every cell: what the dropped frames drew is painted now, once
