"""argparse `type=` functions for numbers and paths, strict where Python's own are lenient.

`int()` takes `²`-free but non-ASCII digits (`１２`, `٣`) and raises a ValueError past 4,300 digits;
`float()` takes `1_0` and Arabic digits; `Path('')` is `.`; and a name past the file system's limits
fails deep inside the run with `OSError: File name too long`. Each of these is a mistake a user can fix,
so each is one argparse error here (`argument --flag: …`, one line, exit 2), before anything is read.
Torch-free: the command line's cheap mistakes are answered before the heavy imports.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from ..engine.errors import ConfigError

MAX_DIGITS = 30  # any count, size or seed the tool takes (a seed is at most 2**64-1: 20 digits)
MAX_NUMBER_CHARS = 60  # a float written out: sign, digits, point, exponent
NAME_MAX = 255  # bytes in one path component (Linux, macOS; NTFS's 255 UTF-16 units is no smaller)
PATH_MAX = 4096  # bytes in a whole path, its terminating NUL included (Linux)
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)", re.IGNORECASE)
SHOWN_CHARS = 24  # how much of a bad value a message repeats
WORD_CHARS = 200  # a word of an error line past this is cut (a 5,000-digit value, a 4 KB path)
CACHE_ENV = "OMNI_CONSOLE_CACHE_DIR"  # engine/cache_dir.py reads it


def shown(text: str) -> str:
    """`text` as a message repeats it: quoted, cut to SHOWN_CHARS characters with its length said."""
    if len(text) <= SHOWN_CHARS:
        return repr(text)
    return f"{text[:SHOWN_CHARS]!r}… ({len(text)} characters)"


def whole_number(text: str) -> int:
    """An integer written with ASCII digits, at most MAX_DIGITS of them."""
    value = text.strip()
    if not _INT.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a whole number (digits 0-9)")
    if len(value.lstrip("+-")) > MAX_DIGITS:
        raise argparse.ArgumentTypeError(f"{shown(text)}: too many digits (at most {MAX_DIGITS})")
    return int(value)


def real_number(text: str) -> float:
    """A decimal number written with ASCII characters (inf and nan parse; the flag's own check refuses them)."""
    value = text.strip()
    if len(value) > MAX_NUMBER_CHARS:
        raise argparse.ArgumentTypeError(f"{shown(text)}: too long for a number (at most {MAX_NUMBER_CHARS} "
                                         "characters)")
    if not _FLOAT.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a number")
    return float(value)


def path_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the file system cannot hold `path` whatever exists (None: it can): empty, a name past
    NAME_MAX bytes or a whole path past PATH_MAX."""
    raw = os.fsencode(path)
    if not raw:
        return "the name is empty"
    if len(raw) >= PATH_MAX:
        return f"the path is {len(raw)} bytes long; the system takes at most {PATH_MAX - 1}"
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        name = shown(os.fsdecode(longest))
        return f"the name {name} is {len(longest)} bytes long; a file name takes at most {NAME_MAX}"
    return None


def path_name(text: str) -> Path:
    """A path the file system can hold (`path_problem`); `Path('')` would silently be `.`."""
    problem = path_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return Path(text)


def short_words(line: str) -> str:
    """`line` with every word past WORD_CHARS characters cut, its length said: an error line stays one
    readable line whatever value it repeats."""
    return " ".join(word if len(word) <= WORD_CHARS else f"{word[:SHOWN_CHARS]}…({len(word)} characters)"
                    for word in line.split(" "))


def check_cache_dir() -> None:
    """`OMNI_CONSOLE_CACHE_DIR` the file system can hold, checked with the flags (ConfigError, one line)."""
    value = os.environ.get(CACHE_ENV)
    if value and (problem := path_problem(value)) is not None:
        raise ConfigError(f"{CACHE_ENV}: {problem}")
