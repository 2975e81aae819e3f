"""Write a generated model folder atomically, and never destroy a file this program did not write.

A builder (the demo, the tiny test families) writes into ``.NAME.tmp-*`` beside the target, adds a
manifest of every file it wrote (relative path, size, sha256) as the completion marker, and renames
the folder into place, so readers never see a half-built folder.

An existing target is replaced only when it is an empty folder or when its whole tree matches its
manifest exactly. Anything else is the operator's data (a note, an ``omni-console-out/`` of images, a
changed or missing file, a symlink, a fifo, an older marker without a manifest): we refuse with
``ConfigError`` and touch nothing. ``shutil.rmtree`` runs only on the temp and ``.NAME.old-*`` folders
this call created itself; the old folder holds the previous target only after it was moved there and
verified again, so deleting it can remove nothing but files a build wrote.

SIGTERM, SIGHUP and SIGINT during a build become exceptions (``SignalGuard``), so the temp folder is removed
and the target is left as it was; during the short swap they are held back until the swap is done.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ConfigError
from ..running.signal_guard import SignalGuard, mark_complete

__all__ = [
    "COMPLETE_MARKER",
    "MANIFEST_FORMAT",
    "BuildManifest",
    "FileEntry",
    "UnwritableFolder",
    "atomic_build",
    "manifest_mismatch",
]

COMPLETE_MARKER = ".omni-console-complete.json"
MANIFEST_FORMAT = "omni-console.build-manifest/1"
_MAX_MARKER_BYTES = 1 << 20
_NOTHING_CHANGED = "nothing was changed"
_ScalarJson = str | int | float | bool | None


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class BuildManifest(BaseModel):
    """The completion marker: what was built (``build``) and every file written (``files``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["omni-console.build-manifest/1"]
    build: dict[str, _ScalarJson]
    files: dict[str, FileEntry]

    @field_validator("files")
    @classmethod
    def _relative_posix_paths(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for name in files:
            parts = PurePosixPath(name).parts
            if (not name or name.startswith("/") or "\\" in name or name != str(PurePosixPath(name))
                    or any(p in (".", "..") for p in parts) or name == COMPLETE_MARKER):
                raise ValueError(f"not a relative file path: {name!r}")
        return files

    def to_json(self) -> str:
        """Deterministic bytes (sorted keys), so builds with the same seed stay byte-identical."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


class UnwritableFolder(ConfigError):
    """The folder that should hold the build cannot be created or written; ``reason`` is short."""

    def __init__(self, folder: Path, reason: str, message: str) -> None:
        super().__init__(message)
        self.folder = folder
        self.reason = reason


class _Mismatch(Exception):
    """The folder is not exactly a build of ours; the message says the first difference found."""


class _OldMarker(_Mismatch):
    """A marker from before manifests: the folder's files cannot be checked."""


# --- manifest ----------------------------------------------------------------------------------


def _open_regular(path: Path) -> int:
    """Open a regular file without following a symlink (a swap after our lstat cannot redirect us);
    O_NONBLOCK so a FIFO put in place of the marker is refused, not waited on."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _Mismatch(f"{path.name} is not a regular file")
    return fd


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    fd = _open_regular(path)
    with os.fdopen(fd, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _walk(root: Path, expected_files: dict[str, FileEntry] | None = None) -> dict[str, int]:
    """Relative path → size of every regular file under ``root``, symlinks not followed.

    With ``expected_files``, stops at the first entry that is not expected (extra file or folder,
    symlink, fifo, socket, device) instead of walking a large foreign tree to the end.
    """
    expected_dirs = {str(p) for name in expected_files or {} for p in PurePosixPath(name).parents} - {"."}
    files: dict[str, int] = {}
    pending = [""]
    while pending:
        rel = pending.pop()
        with os.scandir(root / rel if rel else root) as entries:
            for entry in entries:
                name = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_symlink():
                    raise _Mismatch(f"{name} is a symbolic link")
                if entry.is_dir(follow_symlinks=False):
                    if expected_files is not None and name not in expected_dirs:
                        raise _Mismatch(f"extra folder {name}")
                    pending.append(name)
                elif entry.is_file(follow_symlinks=False):
                    if expected_files is not None and name not in expected_files and name != COMPLETE_MARKER:
                        raise _Mismatch(f"extra file {name}")
                    files[name] = entry.stat(follow_symlinks=False).st_size
                else:
                    raise _Mismatch(f"{name} is not a regular file")
    return files


def _write_manifest(root: Path, build: dict[str, _ScalarJson]) -> None:
    """Record every file the build wrote (written last: its presence means the build finished)."""
    files = {name: FileEntry(size=size, sha256=_sha256(root / name)) for name, size in sorted(_walk(root).items())}
    manifest = BuildManifest(format=MANIFEST_FORMAT, build=build, files=files)
    (root / COMPLETE_MARKER).write_text(manifest.to_json())


def _read_manifest(root: Path) -> BuildManifest:
    if (root / COMPLETE_MARKER).is_symlink():
        raise _Mismatch(f"{COMPLETE_MARKER} is a symbolic link")
    try:
        fd = _open_regular(root / COMPLETE_MARKER)
    except OSError as exc:
        raise _Mismatch(f"{COMPLETE_MARKER} cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(_MAX_MARKER_BYTES + 1)
    try:
        doc = json.loads(data) if len(data) <= _MAX_MARKER_BYTES else None
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's limit
        doc = None
    if isinstance(doc, dict) and "files" not in doc:
        raise _OldMarker("its marker is from an older omni-console and lists no files, so it cannot be checked")
    try:
        return BuildManifest.model_validate(doc)
    except ValidationError:
        raise _Mismatch(f"its marker {COMPLETE_MARKER} is not a valid file manifest") from None


def build_info(root: Path) -> dict[str, _ScalarJson] | None:
    """What the marker in `root` says was built (family, seed, …), or None without a valid marker."""
    try:
        return dict(_read_manifest(Path(root)).build)
    except (_Mismatch, OSError):
        return None


def manifest_mismatch(root: Path, *, trust_unchanged: bool = False) -> str | None:
    """None when ``root`` holds exactly the files its manifest lists (same sizes and sha256), else why not.

    Files are compared by size first (cheap); only then by content. Symlinks are never followed.
    ``trust_unchanged`` (finding the cached demo at every start): when every size matches and no file
    was modified after the manifest was written (the manifest is written last), the hashes are not
    read again; an edited file has a later mtime and is hashed as always.
    """
    try:
        _verify(Path(root), trust_unchanged)
    except _Mismatch as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    return None


def _verify(root: Path, trust_unchanged: bool = False) -> BuildManifest:
    manifest = _read_manifest(root)
    found = _walk(root, manifest.files)
    missing = sorted(set(manifest.files) - set(found))
    if missing:
        raise _Mismatch(f"missing file {missing[0]}")
    for name, entry in manifest.files.items():
        if found[name] != entry.size:
            raise _Mismatch(f"{name} changed size")
    if trust_unchanged and _unchanged_since_manifest(root, manifest):
        return manifest
    for name, entry in manifest.files.items():
        if _sha256(root / name) != entry.sha256:
            raise _Mismatch(f"{name} changed content")
    return manifest


def _unchanged_since_manifest(root: Path, manifest: BuildManifest) -> bool:
    """Every listed file last modified no later than the manifest (written after them all)."""
    written = os.lstat(root / COMPLETE_MARKER).st_mtime_ns
    return all(os.lstat(root / name).st_mtime_ns <= written for name in manifest.files)


# --- what is at the target now -----------------------------------------------------------------

Existing = Literal["absent", "empty", "ours"]


def _existing(path: Path) -> Existing:
    """Classify the target; anything we may not replace raises ConfigError (and nothing is touched)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return "absent"
    except NotADirectoryError:
        return "absent"  # the parent is a file: reported when the temp folder cannot be made
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror}); {_NOTHING_CHANGED}") from None
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{path}: is a symbolic link; give a new or empty folder ({_NOTHING_CHANGED})")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path}: is a file, not a folder; give a new or empty folder ({_NOTHING_CHANGED})")
    try:
        with os.scandir(path) as entries:
            if next(entries, None) is None:
                return "empty"
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror}); {_NOTHING_CHANGED}") from None
    if not os.path.lexists(path / COMPLETE_MARKER):
        raise ConfigError(f"{path}: folder is not empty and is not an omni-console demo model; "
                          f"give a new or empty folder ({_NOTHING_CHANGED})")
    how_to_proceed = f"pick another folder, or delete this one yourself and run again ({_NOTHING_CHANGED})"
    try:
        _verify(path)
    except _OldMarker:
        raise ConfigError(f"{path}: not replaced, it holds a demo model from an older omni-console whose marker "
                          f"lists no files, so it cannot be checked; {how_to_proceed}") from None
    except _Mismatch as exc:
        raise ConfigError(f"{path}: not replaced, it does not match the omni-console build written there ({exc}); "
                          f"{how_to_proceed}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror}); {_NOTHING_CHANGED}") from None
    return "ours"


# --- the build ---------------------------------------------------------------------------------


@dataclass
class _Scratch:
    """The folders this call created itself: the only ones it may ``rmtree``."""

    tmp: Path | None = None
    old: Path | None = None
    old_verified: bool = False
    """The target moved into ``old`` was checked again there (empty, or matching its manifest)."""

    def remove(self) -> None:
        if self.tmp is not None and os.path.lexists(self.tmp):
            shutil.rmtree(self.tmp, ignore_errors=True)
        if self.old is not None and (self.old_verified or not os.path.lexists(self.old / "x")):
            shutil.rmtree(self.old, ignore_errors=True)  # else: a moved target we could not put back stays


def _unwritable(folder: Path, reason: str) -> UnwritableFolder:
    return UnwritableFolder(folder, reason, f"{folder}: {reason}; give a folder you can write to ({_NOTHING_CHANGED})")


def _make_temp(path: Path) -> Path:
    """Create ``.NAME.tmp-*`` beside ``path``: the real test that the parent is a writable folder."""
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise _unwritable(parent, "is a file, not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=parent))
    except (FileExistsError, NotADirectoryError):
        raise _unwritable(parent, "is not a folder (a part of it is a file)") from None
    except OSError as exc:
        raise _unwritable(parent, f"cannot write here ({exc.strerror or exc})") from None


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o777 & ~umask  # mkdtemp makes 0700; a new folder should look like any other


def _swap(tmp: Path, path: Path, scratch: _Scratch, *, replace: bool) -> None:
    """Move the finished ``tmp`` to ``path``; an existing empty folder or own build is moved aside first."""
    current = _existing(path)  # again: the build took a while
    if current == "ours" and not replace:
        return  # a concurrent builder won; keep theirs, ours is discarded
    if current != "absent":
        scratch.old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
        aside = scratch.old / "x"
        os.rename(path, aside)
        if _existing_aside(aside) != current:  # changed between the check and the move: put it back
            os.rename(aside, path)
            raise ConfigError(f"{path}: changed while the build ran; {_NOTHING_CHANGED}")
        scratch.old_verified = True
        tmp.chmod(stat.S_IMODE(aside.lstat().st_mode))  # the folder keeps the mode the operator gave it
    try:
        os.rename(tmp, path)
    except OSError as exc:
        if scratch.old is not None:
            with suppress(OSError):  # path was free a moment ago; put the original back
                os.rename(scratch.old / "x", path)
        if not replace and manifest_mismatch(path) is None:
            return  # a concurrent builder won the race
        raise ConfigError(f"{path}: could not move the new build into place ({exc.strerror}); "
                          f"{_NOTHING_CHANGED}") from None


def _existing_aside(aside: Path) -> Existing | None:
    try:
        return _existing(aside)
    except ConfigError:
        return None


def atomic_build(path: Path, build: Callable[[Path], None], marker: dict[str, _ScalarJson], *,
                 replace: bool = True) -> Path:
    """Run ``build(tmp)`` in a temp folder beside ``path``, write the manifest, then rename into place.

    ``path`` may be absent, an empty folder (its mode bits are kept), or an earlier build whose tree
    matches its manifest; anything else raises ConfigError before anything is built. With
    ``replace=False`` an earlier build found at ``path`` (e.g. a concurrent builder won the race) is
    kept and ours discarded. Raises ``UnwritableFolder`` (a ConfigError) when the parent cannot be
    written. See the module docstring for signals and why ``rmtree`` is safe here.
    """
    path = Path(os.path.abspath(path))  # "." or "x/.." name a real folder and parent; symlinks are not resolved
    with SignalGuard() as guard:
        _existing(path)  # refuse early, before creating anything
        scratch = _Scratch()
        try:
            with guard.held():
                scratch.tmp = _make_temp(path)
            try:
                scratch.tmp.chmod(_default_mode())
                build(scratch.tmp)
                _write_manifest(scratch.tmp, marker)
                with guard.held():
                    _swap(scratch.tmp, path, scratch, replace=replace)
                    mark_complete([path])
            except OSError as exc:  # disk full, folder removed under us...: the operator's to fix
                raise _unwritable(path.parent, f"cannot write the build here ({exc.strerror or exc})") from None
        finally:
            with guard.held():
                scratch.remove()
    return path
