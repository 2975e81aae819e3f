"""The staging log's lines: a `Log` that follows the newest line until the operator scrolls up.

Following is decided here, not by `Log`'s own "was I at the end?" check: that check reads
the scroll offset before the previous write's deferred scroll has happened, so two batches in one
refresh left the view stuck on old lines for the rest of a request. Scrolling up (keys, wheel) stops
following, End (or scrolling back to the bottom) follows again; each change is posted as
`FollowLog.FollowChanged` so the owner's title can say it.
"""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import Log


class FollowLog(Log):
    """A `Log` that knows whether the operator wants the newest line: scrolling up (keys, wheel)
    stops following, End (or scrolling back to the bottom) follows again."""

    class FollowChanged(Message):
        def __init__(self, following: bool) -> None:
            super().__init__()
            self.following = following

    def __init__(self, *, max_lines: int | None = None) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=False)
        self.following = True

    def set_following(self, following: bool) -> None:
        if following != self.following:
            self.following = following
            self.post_message(self.FollowChanged(following))
        if following:
            self.scroll_end(animate=False, x_axis=False)

    def follow_newest(self) -> None:
        """Scroll to the newest line after the next layout (the new lines' height is known then)."""
        self.scroll_end(animate=False, x_axis=False)

    def _left_the_end(self) -> None:
        if self.max_scroll_y > 0 and self.scroll_target_y < self.max_scroll_y:
            self.set_following(False)

    def _back_at_the_end(self) -> None:
        if self.scroll_target_y >= self.max_scroll_y:
            self.set_following(True)

    def action_scroll_up(self) -> None:
        super().action_scroll_up()
        self._left_the_end()

    def action_page_up(self) -> None:
        super().action_page_up()
        self._left_the_end()

    def action_scroll_home(self) -> None:
        super().action_scroll_home()
        self.scroll_target_y = 0
        self._left_the_end()

    def action_scroll_down(self) -> None:
        super().action_scroll_down()
        self._back_at_the_end()

    def action_page_down(self) -> None:
        super().action_page_down()
        self._back_at_the_end()

    def action_scroll_end(self) -> None:
        self.set_following(True)

    def _on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        super()._on_mouse_scroll_up(event)
        self._left_the_end()

    def _on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        super()._on_mouse_scroll_down(event)
        self._back_at_the_end()
