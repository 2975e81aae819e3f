"""Strings from data, made safe to print: every control or invisible format character shown escaped.

Names, class names, paths, prompts and error messages come from a model directory, the cache or the
operator's shell. Written raw, `ESC ]52;c;…` in a file name writes the clipboard, `ESC ]2;…` retitles
the terminal, a C1 byte starts a sequence on some terminals, U+202E reverses what follows, and a
lone surrogate (a non-UTF-8 file name) makes `print` fail. `plain` turns each such character into
its Python escape (`\\x1b`, `\\u202e`, `\\udcff`) so the operator sees it and the terminal never acts
on it. Every formatter that shows a data string calls it; markup is a separate matter: rich and
Textual get such strings as `Text`/`Content`, never as markup.
"""

from __future__ import annotations

import unicodedata

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _unsafe(ch: str) -> bool:
    """Control (Cc), format (Cf: bidi overrides, zero-width), surrogate, line/paragraph separators."""
    return not ch.isprintable() and unicodedata.category(ch) != "Zs"


def plain(value: object) -> str:
    """`str(value)` with every control/format character escaped visibly; one line (tabs, newlines too)."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(_escape(ch) if _unsafe(ch) else ch for ch in text)


def plain_lines(value: object) -> str:
    """Like `plain`, but newlines are kept (a multi-line message shown as several lines)."""
    text = value if isinstance(value, str) else str(value)
    return "\n".join(plain(line) for line in text.split("\n"))


def shown(value: object, limit: int = 80) -> str:
    """A data value as an error line quotes it: `plain`, then cut to `limit` characters with "…" (a 100 KB
    `quant_method` must not make a 100 KB line). Strings are quoted (repr) so an empty one is visible."""
    text = plain(repr(value) if isinstance(value, str) else value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
