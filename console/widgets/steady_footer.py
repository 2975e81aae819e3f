"""A Footer that is rebuilt only when the keys it shows change.

Textual's Footer removes and remounts every key on each bindings change, and focus moving between
panels is one: Tab re-laid out the footer four times (a tenth of a second of the 0.45 s a Tab took
on the live screen) though the keys shown stayed the same. Here the shown keys (key, action,
description, enabled, tooltip, group) are compared first, and an equal set is left as it is.
"""

from __future__ import annotations

from textual.screen import Screen
from textual.widgets import Footer


def shown_keys(screen: Screen) -> tuple[tuple[object, ...], ...]:
    """What the footer would show for `screen` now."""
    return tuple((b.key, b.action, b.description, enabled, tooltip, b.group)
                 for (_, b, enabled, tooltip) in screen.active_bindings.values() if b.show)


class SteadyFooter(Footer):
    """`Footer` that skips the rebuild when the shown keys are the same as last time."""

    _shown: tuple[tuple[object, ...], ...] | None = None

    def bindings_changed(self, screen: Screen) -> None:
        if self._bindings_ready and self.is_attached and screen is self.screen and screen.app.app_focus:
            shown = shown_keys(screen)
            if shown == self._shown:
                return
            self._shown = shown
        super().bindings_changed(screen)
