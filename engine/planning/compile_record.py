"""What earlier runs measured of regional compile, per block signature, under the tool's cache dir.

A signature names what Inductor's cache keys on that we can know before tracing: the model, its repeated
block classes, the request size, the device, the backend and mode and the torch version. The record holds the
measured cold and warm compile seconds and the workspace; `compile_choice` forecasts from it. Read like every
cache file (`cache_dir.read_cache_file`: regular file, bounded, never followed); a bad one is ignored.

Inductor's own cache (`inductor_cache_dir`) lives beside it. Its FX graph entries are pickles that torch
unpickles: the directory is the tool's own, created by it for this user, and written only by torch in this
user's processes (docs/security.md says what that does and does not protect against).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from ..cache_dir import CacheFileError, cache_root, read_cache_file, write_cache_file
from .compile_choice import CompileRecord

MAX_RECORD_BYTES = 4096


def compile_root() -> Path:
    return cache_root() / "compile"


def inductor_cache_dir() -> Path:
    """Where Inductor (and Triton) keep compiled kernels for this tool: under its cache dir."""
    return cache_root() / "inductor"


def signature(model: str, classes: list[str], size_label: str, device: str, backend: str, mode: str | None,
              torch_version: str) -> str:
    """A short stable key of what a compile depends on that is known before tracing."""
    text = json.dumps([model, sorted(classes), size_label, device, backend, mode or "default", torch_version])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _path(sig: str) -> Path:
    return compile_root() / f"{sig}.json"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and 0 <= value < 1e7 else None


def read_record(sig: str) -> tuple[CompileRecord | None, str | None]:
    """The record for `sig` (None: none yet) and, when the file was unusable, why (then it is ignored)."""
    try:
        data = read_cache_file(_path(sig), MAX_RECORD_BYTES)
    except CacheFileError as exc:
        return None, f"compile record {sig}: {exc}; ignored"
    if data is None:
        return None, None
    try:
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError("not an object")
    except ValueError:
        return None, f"compile record {sig}: not a JSON object; ignored"
    ws = _number(raw.get("workspace_bytes"))
    return CompileRecord(cold_s=_number(raw.get("cold_s")), warm_s=_number(raw.get("warm_s")),
                         workspace_bytes=int(ws) if ws is not None else None,
                         max_abs_diff=_number(raw.get("max_abs_diff"))), None


def save_measured(sig: str, seconds: float, cold: bool, workspace_bytes: int | None = None) -> None:
    """Add one measured compile phase to the record (cold or warm); the largest workspace seen is kept."""
    old, _ = read_record(sig)
    old = old or CompileRecord()
    ws = max(w for w in (old.workspace_bytes, workspace_bytes) if w is not None) if (
        old.workspace_bytes is not None or workspace_bytes is not None) else None
    record = {"cold_s": seconds if cold else old.cold_s, "warm_s": old.warm_s if cold else seconds,
              "workspace_bytes": ws, "max_abs_diff": old.max_abs_diff}
    write_cache_file(_path(sig), json.dumps(record), prefix=".compile-")


def has_inductor_entries() -> bool:
    """Whether Inductor's cache dir holds anything (a warm start is possible); never follows a symlink."""
    root = inductor_cache_dir()
    if root.is_symlink() or not root.is_dir():
        return False
    return any(True for _ in root.iterdir())
