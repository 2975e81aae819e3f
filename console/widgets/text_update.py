"""Cheap text updates for values that change many times a second.

`Static.update` re-lays-out the whole screen by default; a live screen has hundreds of widgets,
so that reflow (not the text) dominated the UI thread's time while the engine ran. Here an update
is skipped when the text is unchanged, and the reflow is asked for only when the text's length
changed (a wrapped line count can only change then) or the caller says the size may change.
"""

from __future__ import annotations

from textual.widgets import Static


def set_text(widget: Static, text: str, *, fixed_size: bool = False) -> bool:
    """Show `text` in `widget`; returns False when nothing changed."""
    old = getattr(widget, "_omni_text", None)
    if old == text:
        return False
    widget._omni_text = text  # type: ignore[attr-defined]
    widget.update(text, layout=not fixed_size and (old is None or len(old) != len(text)))
    return True
