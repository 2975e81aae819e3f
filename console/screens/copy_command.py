"""`c`: the vllm serve command shown whole for selecting by hand, never broken inside a word.

A toast folds a long path or the JSON policy mid-word, and a command copied from that by hand is
wrong. Here the command is split into shell words (`shlex`) and laid out as lines of whole words
joined with ` \\` continuations, each line re-quoted, so any lines selected together are the same
command to a shell. A word holding a control or bidi character (a hostile model path) is shown in
bash's `$'…'` quoting, escaped (`\\x1b`, `\\u202e`): the terminal never acts on it, and the line pasted
into bash is still the same path. The clipboard gets the command itself (OSC 52 sends it base64).
Esc, Enter or c closes it.
"""

from __future__ import annotations

import shlex
import unicodedata

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

_BASH_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\\": "\\\\", "'": "\\'"}


def _bash_escape(ch: str) -> str:
    """`ch` inside bash's $'…': named escapes, else \\xHH for a byte (a surrogate-escaped one too), else \\u."""
    if ch in _BASH_NAMED:
        return _BASH_NAMED[ch]
    if ch.isprintable() or unicodedata.category(ch) == "Zs":
        return ch
    code = ord(ch)
    if code < 0x80:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # a byte of a non-UTF-8 file name (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shell_word(word: str) -> str:
    """`word` quoted for a shell, printable: `shlex.quote` when it is, bash's $'…' with escapes when not."""
    if word.isprintable():
        return shlex.quote(word)
    return "$'" + "".join(_bash_escape(ch) for ch in word) + "'"


def shell_lines(command: str, width: int) -> list[str]:
    """The command as lines of at most `width` characters where whole words allow (a single longer word
    keeps its own line); every line but the last ends with ` \\`."""
    words = [shell_word(w) for w in shlex.split(command)]
    lines: list[str] = []
    line = ""
    for word in words:
        candidate = f"{line} {word}" if line else word
        if line and len(candidate) + 2 > width:  # room for the " \" continuation
            lines.append(line)
            line = f"  {word}"
        else:
            line = candidate
    lines.append(line)
    return [f"{text} \\" for text in lines[:-1]] + lines[-1:]


class CopyCommandScreen(ModalScreen[None]):
    """The serve command in whole-word lines, with how it was sent to the clipboard."""

    DEFAULT_CSS = """
    CopyCommandScreen { align: center bottom; }
    CopyCommandScreen > Vertical { width: 100%; height: auto; border: round $accent; background: $surface;
                                   padding: 0 1; }
    CopyCommandScreen #copy-note { color: $text-muted; }
    """

    BINDINGS = [Binding("escape,enter,c", "close", "close", id="copy.close")]

    def __init__(self, command: str, note: str) -> None:
        super().__init__()
        self.command, self.note = command, note
        self.lines: list[str] = []

    def compose(self) -> ComposeResult:
        width = max(self.app.size.width - 4, 20)  # inside the border and padding
        self.lines = shell_lines(self.command, width)
        with Vertical() as box:
            box.border_title = "vllm serve (Esc closes)"
            yield Static(self.note, id="copy-note", markup=False)
            yield Static("\n".join(self.lines), id="copy-command", markup=False)

    def action_close(self) -> None:
        self.dismiss(None)
