"""What `class_index` and `init_layout` read from diffusers' and transformers' source, kept across processes.

Reading the installed packages' lazy-import tables and class statements with `ast` costs a second
or more on a small machine (a class transformers does not export under its folder's prefix means
every model folder's `__all__`), and every `plan` asked the same questions again. The answers depend
only on the installed packages, so they are kept in one JSON file per installed diffusers and
transformers (version, folder, and the modification time of each package's `__init__.py`: a
reinstall or an upgrade starts a new file) in omni-console's cache folder.

The file is input, never trusted beyond a cache: read through `read_cache_file` (regular file, no
symlink, bounded size), and every entry is checked for shape (known kinds, identifiers, a module
inside the package it names); one bad entry discards the whole file and the source is read again.
Nothing here widens what a model directory may name: a cached class is confirmed against the one
source module it names (the class statement is there, its kind is what its bases say) and recomputed
if not, and the loader still imports the real class and checks it again (`trusted_classes`). Only the
expensive part, finding which module exports a name, is taken from the file. No torch, no import of either package.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from ..cache_dir import CacheFileError, cache_root, read_cache_file
from .installed_source import package_root

INDEX_VERSION = 2  # 2: a pipeline package's class may be defined in its own __init__
MAX_INDEX_BYTES = 2 * 1024 * 1024
MAX_ENTRIES = 8192
LIBRARIES = ("diffusers", "transformers")
KINDS = frozenset({"pipeline", "modular", "weights", "loadable", "other"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")

_memo: dict[Path, dict[str, Any]] = {}


@functools.cache
def _package_key(library: str) -> tuple[object, ...]:
    """(library, version, folder, mtime of its `__init__.py`), read once per process."""
    root = package_root(library)
    try:
        version = metadata.version(library)
    except metadata.PackageNotFoundError:
        version = None
    try:
        mtime = (root / "__init__.py").stat().st_mtime_ns if root else None
    except OSError:
        mtime = None
    return library, version, str(root) if root else None, mtime


def index_path() -> Path:
    """This installation's index file (a new one per diffusers/transformers version or reinstall)."""
    key = json.dumps([INDEX_VERSION, *(_package_key(lib) for lib in LIBRARIES)])
    return cache_root() / "class_index" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def _dotted(value: object, prefix: str) -> bool:
    return (isinstance(value, str) and value.startswith(prefix) and len(value) < 400
            and all(_NAME.match(part) for part in value.split(".")))


def _valid_ref(value: object, module_prefix: str) -> bool:
    """A ClassRef as `_ref_to_json` writes it, its module inside the package it belongs to."""
    return value is None or (isinstance(value, dict) and set(value) == {"module", "kind", "is_class"}
                             and _dotted(value["module"], module_prefix) and value["kind"] in KINDS
                             and isinstance(value["is_class"], bool))


def _valid_layout(value: object) -> bool:
    if value is None:
        return True
    if not isinstance(value, dict) or set(value) != {"order", "counts"}:
        return False
    order, counts = value["order"], value["counts"]
    return (isinstance(order, list) and all(isinstance(a, str) and _NAME.match(a) for a in order)
            and isinstance(counts, list)
            and all(isinstance(c, list) and len(c) == 2 and all(isinstance(s, str) and _NAME.match(s) for s in c)
                    for c in counts))


def valid_entry(key: object, value: object) -> bool:
    """Whether one cached answer has the shape this module writes (anything else discards the file)."""
    if not isinstance(key, str):
        return False
    parts = key.split("|")
    if len(parts) != 3 or not all(_NAME.match(p) for p in parts[1:]):
        return False
    kind, library, _ = parts
    if kind == "exports":
        return library in LIBRARIES and isinstance(value, bool)
    if kind == "find":
        return library in LIBRARIES and _valid_ref(value, f"{library}.")
    if kind == "package_class":  # defined in the package's own __init__ (prx's T5GemmaEncoder) or below it
        package = f"diffusers.pipelines.{library}"
        return _valid_ref(value, package + ".") or (_valid_ref(value, package) and value["module"] == package)
    if kind == "layout":
        return library == "diffusers" and _valid_layout(value)
    return False


def _load(path: Path) -> dict[str, Any]:
    try:
        raw = read_cache_file(path, MAX_INDEX_BYTES)
        document = json.loads(raw) if raw is not None else None
    except (CacheFileError, ValueError, UnicodeDecodeError, RecursionError):
        return {}
    if not isinstance(document, dict) or document.get("version") != INDEX_VERSION:
        return {}
    entries = document.get("entries")
    if (not isinstance(entries, dict) or len(entries) > MAX_ENTRIES
            or not all(valid_entry(k, v) for k, v in entries.items())):
        return {}
    return entries


def _save(path: Path, entries: dict[str, Any]) -> None:
    """Written whole to a temporary file, then renamed over the old one; a cache that cannot be written is
    only slower next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".class-index-", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"version": INDEX_VERSION, "entries": entries}, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


def _entries() -> tuple[Path, dict[str, Any]]:
    path = index_path()
    if path not in _memo:
        _memo[path] = _load(path)
    return path, _memo[path]


def remembered(kind: str, library: str, name: str, compute: Callable[[], Any],
               confirm: Callable[[Any], bool] | None = None) -> Any:
    """The cached JSON answer to (kind, library, name), else `compute()`'s, kept for the next process.

    `compute` returns the JSON form (`None`, a bool, or the dict `valid_entry` accepts for the kind);
    an answer that would not pass that check is returned but not kept. `confirm` re-checks a cached answer
    against the installed source (cheaper than `compute`: the one module it names); an answer it rejects
    is computed again and replaced, so a poisoned file never widens what a model directory may name."""
    path, entries = _entries()
    key = f"{kind}|{library}|{name}"
    if key in entries and (confirm is None or confirm(entries[key])):
        return entries[key]
    value = compute()
    if valid_entry(key, value) and (key in entries or len(entries) < MAX_ENTRIES):
        entries[key] = value
        _save(path, entries)
    return value


def forget_loaded() -> None:
    """Drop what this process read (tests: the next lookup reads the file again)."""
    _memo.clear()
