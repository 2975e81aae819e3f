"""Writing a request's trace (`run --trace PATH`, the console's trace key): checked like an output, before
anything loads, and written atomically — complete under its name or not at all, never over a file the
user did not name with `--overwrite`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .atomic_write import write_new, write_replacing
from .outputs import _nearest_existing, _probe_writable

SUFFIX = ".json"


def check_trace_place(path: Path, *, overwrite: bool = False, output: Path | None = None,
                      flag: str = "--trace") -> None:
    """Refuse, with one line, a trace the run could not write: not `.json`, a directory, a folder it cannot
    create files in, an existing file without `overwrite`, or the run's own `output`."""
    shown = f"{flag} {str(path)!r}"
    if path.is_dir():
        raise ConfigError(f"{shown} is a directory (name a file, e.g. {path / 'trace.json'})")
    if path.suffix.lower() != SUFFIX:
        raise ConfigError(f"{shown}: a trace is JSON (name a .json file, e.g. trace.json)")
    if output is not None and os.path.abspath(output) == os.path.abspath(path):
        raise ConfigError(f"{shown} is the output's own name (name another file)")
    anchor = _nearest_existing(path.parent)
    if not anchor.is_dir():
        raise ConfigError(f"{shown}: {anchor} is not a directory")
    reason = _probe_writable(anchor)
    if reason is not None:
        raise ConfigError(f"{shown}: cannot create files in {anchor} ({reason})")
    if os.path.lexists(path) and not overwrite:
        raise ConfigError(f"{shown} exists; pass --overwrite to replace it")


def write_trace(path: Path, trace: dict[str, Any], *, overwrite: bool = False) -> int:
    """Write `trace` at `path` (FileExistsError if it exists and not `overwrite`); returns its size in bytes."""
    data = json.dumps(trace, separators=(",", ":"), ensure_ascii=False).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if overwrite and os.path.lexists(path):
        write_replacing(path, lambda stream: stream.write(data))
    else:
        write_new(path, lambda stream: stream.write(data))
    return len(data)
