"""Measured step-cache hit rates, kept per (pipeline family, --cache setting, steps) in the cache directory, so the
next plan's range says what this model really hit, not only its bounds.

A cached request's step times are not the model's (its skipped blocks ran no compute), so such a request keeps no
request profile (engine.py); it keeps its hit counts here instead. The file is cache input: read through
`read_cache_file` (bounded, no symlink), every entry type-checked; anything else is ignored, never trusted.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cache_dir import CacheFileError, cache_root, read_cache_file, write_cache_file
from .cache_spec import CacheSpec

FILE = "cache_hits.json"
MAX_BYTES = 1 << 20
MAX_ENTRIES = 1000


@dataclass(frozen=True, slots=True)
class HitRate:
    forwards: int
    hits: int
    steps: int

    @property
    def rate(self) -> float:
        return self.hits / self.forwards if self.forwards else 0.0


def _path() -> Path:
    return cache_root() / FILE


def _key(family: str, spec: CacheSpec, steps: int) -> str:
    return f"{family}|{spec.text()}|{steps}"


def _read() -> dict[str, list[int]]:
    try:
        raw = read_cache_file(_path(), MAX_BYTES)
        data = json.loads(raw) if raw else {}
    except (CacheFileError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, list) and len(v) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**53 for n in v) and v[1] <= v[0]}


def record_hits(family: str, spec: CacheSpec, steps: int, forwards: int, hits: int) -> None:
    """Add one request's counts (the cache directory's atomic writer: a reader never sees half of it)."""
    if forwards <= 0:
        return
    data = _read()
    key = _key(family, spec, steps)
    old = data.pop(key, [0, 0])
    data[key] = [old[0] + forwards, old[1] + hits]  # newest last: the oldest go first past MAX_ENTRIES
    data = dict(list(data.items())[-MAX_ENTRIES:])
    write_cache_file(_path(), json.dumps(data), f".{FILE}.")


def measured_hits(family: str, spec: CacheSpec) -> HitRate | None:
    """The hit rate measured for this family and setting (the step count with the most forwards), or None."""
    prefix = f"{family}|{spec.text()}|"
    best: HitRate | None = None
    for key, (forwards, hits) in _read().items():
        steps = key[len(prefix):]
        if key.startswith(prefix) and steps.isdigit() and (best is None or forwards > best.forwards):
            best = HitRate(forwards, hits, int(steps))
    return best


def keep_hits(family: str, spec: CacheSpec, steps: Sequence[Any]) -> None:
    """A finished request's counts (its `StepTiming`s); a cache that cannot be written loses them, nothing more."""
    forwards, hits = sum(s.cache_forwards for s in steps), sum(s.cache_hits for s in steps)
    with contextlib.suppress(OSError):
        record_hits(family, spec, len(steps), forwards, hits)
