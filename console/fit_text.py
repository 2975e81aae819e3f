"""Text made to fit a width without breaking a word: long words (paths) lose their middle to `…`.

Textual wraps a line at spaces, but a word longer than the line is folded at any character
(`request-0007-2026010` / `1-120000.png`), and a folded path copied by hand is wrong. Here each such
word is shortened in the middle instead (a path keeps its file name: `/home/…/request-0007.png`), so
the wrapped text only ever breaks at spaces. `one_line` does the same to a whole line (a notice on a
narrow terminal) and cuts the end with `…` only when shortening words is not enough.
Textual-free (unit-tested as strings).
"""

from __future__ import annotations

ELLIPSIS = "…"


def middle_ellipsis(word: str, width: int) -> str:
    """`word` in at most `width` characters: its middle replaced by `…`; a path keeps its last component
    (and as much of its start as fits) when that fits."""
    if len(word) <= width:
        return word
    if width <= 1:
        return ELLIPSIS[:width]
    head, sep, tail = word.rpartition("/")
    if sep and head and len(tail) + 2 <= width:  # `…/name` at least
        keep = width - len(tail) - 2
        return f"{word[:keep]}{ELLIPSIS}/{tail}"
    left = (width - 1 + 1) // 2
    right = width - 1 - left
    return f"{word[:left]}{ELLIPSIS}{word[len(word) - right:] if right else ''}"


def fit_words(text: str, width: int) -> str:
    """`text` with every word longer than `width` shortened in the middle (line breaks and spaces kept), so
    wrapping it at `width` never breaks inside a word. A width under 2 leaves the text as it is."""
    if width < 2:
        return text
    lines = []
    for line in text.split("\n"):
        words = line.split(" ")
        lines.append(" ".join(middle_ellipsis(w, width) if len(w) > width else w for w in words))
    return "\n".join(lines)


def one_line(text: str, width: int) -> str:
    """`text` on one line of at most `width` characters: the longest words shortened in the middle first
    (to no less than 12 characters), then the end cut with `…`."""
    words = " ".join(text.split()).split(" ")
    while len(" ".join(words)) > width:
        longest = max(range(len(words)), key=lambda i: len(words[i]))
        excess = len(" ".join(words)) - width
        target = max(len(words[longest]) - excess, 12)
        if target >= len(words[longest]):
            break
        words[longest] = middle_ellipsis(words[longest], target)
    line = " ".join(words)
    return line if len(line) <= width else line[: max(width - 1, 0)] + ELLIPSIS
