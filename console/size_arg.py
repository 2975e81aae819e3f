"""`--vram-budget SIZE` and `--ram-budget SIZE`: a memory size as an operator writes it.

Accepted: a number with an optional unit — B, K/KB, M/MB, G/GB, T/TB (powers of 1000) or KiB, MiB,
GiB, TiB (powers of 1024); case-insensitive, spaces around the unit allowed; a bare number is GB.
Refused with one line: anything else, zero, negatives, NaN/inf, and sizes past 1 PB (too large).
"""

from __future__ import annotations

import math
import re

from ..engine.errors import ConfigError
from .flag_types import shown

UNITS = {"": 10**9, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
         "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
LIMIT = 10**15
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_size(text: str, flag: str = "--vram-budget") -> int:
    """Bytes for `text` (see the module docstring); ConfigError with one line otherwise."""
    if text.strip().startswith("-"):
        raise ConfigError(f"{flag} must be a positive size such as 24GB, got {text!r:.60}")
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in UNITS:
        raise ConfigError(f"{flag} must be a size such as 24GB, 24GiB or 8000MB, got {shown(text)}")
    value = float(match.group(1)) * UNITS[unit]  # float: 5,000 digits are inf, never int()'s ValueError
    if not math.isfinite(value) or value > LIMIT:
        raise ConfigError(f"{flag} {shown(text)}: too large (at most 1 PB; no device has that much memory)")
    if value < 1:
        raise ConfigError(f"{flag} must be at least 1 byte, got {shown(text)}")
    return int(value)
