"""An Input that never writes a control character to the terminal, and keeps what was typed or given.

A prompt from `--prompt`, a remembered request or a paste can hold ESC, BEL, CR or U+202E. Textual's
Input renders its value raw, so the terminal would act on them. Escaping the value (`plain()`) would
change what the pipeline gets and move the cursor off its character; here each such character is
drawn as one visible stand-in instead (␛ ␇ ␍ for C0 and DEL, � for C1, bidi and other format
characters), so the value, the cursor and the selection stay as they are.
"""

from __future__ import annotations

import unicodedata

from rich.text import Text
from textual.widgets import Input

REPLACEMENT = "\ufffd"


def shown_char(ch: str) -> str:
    """The one character drawn for `ch`: itself, or a control picture / U+FFFD stand-in."""
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)
    if code == 0x7F:
        return "\u2421"
    if not ch.isprintable() and unicodedata.category(ch) != "Zs":
        return REPLACEMENT
    return ch


def shown_value(value: str) -> str:
    """`value` with every control or format character drawn as its stand-in (same length)."""
    return value if value.isprintable() else "".join(shown_char(ch) for ch in value)


class PlainInput(Input):
    """`Input` whose value is drawn with stand-ins for control and format characters."""

    @property
    def _value(self) -> Text:
        if self.password:
            return super()._value
        text = Text(shown_value(self.value), no_wrap=True, overflow="ignore", end="")
        return self.highlighter(text) if self.highlighter is not None else text
