"""Column widths for a table on a narrow terminal that never break a word in the middle.

rich shrinks columns and then folds their cells at any character (`compone/nt`, `transfor/mer`),
which makes a name unreadable and a copied value wrong. Here each column is at least as wide as
the longest word it holds (a number with its unit counts as one word), so cells wrap only at
spaces; the columns named `squeeze` (free text such as a class name) may be narrower, and a word
too long for them is cut with `…`. Used by `plan` on a terminal and by the plan screen's panels.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

SQUEEZE_MIN = 6
"""The narrowest a squeezable column gets (`Flux…` still says which class it is)."""


def _longest_word(text: str, whole: bool) -> int:
    if whole:
        return len(text)
    return max((len(word) for word in text.split()), default=0)


def fit_widths(header: Sequence[str], rows: Sequence[Sequence[str]], room: int,
               squeeze: Collection[int] = (), whole: Collection[int] = ()) -> list[int] | None:
    """Widths for the columns within `room` characters of content (separators already taken off), or
    None when every column fits at its natural width.

    `whole`: columns whose cells and header never wrap (numbers with units); `squeeze`: columns that may cut a
    word with `…`. The room left above the minimums goes to the columns that want more, in proportion."""
    n = len(header)
    cells = [[str(row[j]) for row in rows] for j in range(n)]
    natural = [max([len(header[j]), *(len(c) for c in cells[j])]) for j in range(n)]
    if sum(natural) <= room:
        return None
    least = []
    for j in range(n):
        word = max([_longest_word(header[j], j in whole), *(_longest_word(c, j in whole) for c in cells[j])])
        least.append(min(natural[j], SQUEEZE_MIN) if j in squeeze else word)
    widths = list(least)
    spare = room - sum(least)
    # squeezed columns first: below their natural width they lose letters, the others only wrap
    for group in ([j for j in range(n) if j in squeeze], [j for j in range(n) if j not in squeeze]):
        spare = _share(widths, natural, group, spare)
    return widths


def _share(widths: list[int], natural: Sequence[int], columns: Sequence[int], spare: int) -> int:
    """Give up to `spare` characters to `columns` in proportion to what each still wants; returns the rest."""
    want = {j: natural[j] - widths[j] for j in columns}
    total = sum(want.values())
    if spare <= 0 or not total:
        return spare
    if total <= spare:
        for j in columns:
            widths[j] = natural[j]
        return spare - total
    shares = {j: spare * want[j] // total for j in columns}
    for j in columns:
        widths[j] += shares[j]
    left = spare - sum(shares.values())
    for j in sorted(columns, key=lambda k: want[k] - shares[k], reverse=True):  # the remainder, one each
        if left <= 0:
            break
        if widths[j] < natural[j]:
            widths[j] += 1
            left -= 1
    return left
