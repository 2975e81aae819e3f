"""The focused panel's title drawn reversed, set on that one widget as focus moves.

A `*:focus-within` CSS rule did this before, and made Textual restyle every widget of the screen on
each focus change (`Screen._update_focus_styles` walks the whole subtree of the outermost node such
a rule can match: with `*`, the app): Tab took 0.45 s on the live screen. Here focus and blur only
set or clear one inline style on the nearest titled ancestor of the focused widget.
"""

from __future__ import annotations

from textual.screen import Screen
from textual.widget import Widget

FOCUSED_TITLE_STYLE = "bold reverse"


def titled_ancestor(widget: Widget) -> Widget | None:
    """The nearest widget (itself included) below the screen that has a border title."""
    for node in widget.ancestors_with_self:
        if isinstance(node, Screen) or not isinstance(node, Widget):
            return None
        if node.border_title:
            return node
    return None


def show_focus(widget: Widget, focused: bool) -> None:
    """Reverse (or restore) the title of the panel `widget` sits in."""
    panel = titled_ancestor(widget)
    if panel is None:
        return
    if focused:
        panel.styles.border_title_style = FOCUSED_TITLE_STYLE
    else:
        panel.styles.clear_rule("border_title_style")
        panel.refresh()
