"""Paths from an untrusted model directory: plain names, no escape through links, regular files only.

A model directory is input an operator downloaded, not code they wrote: its `model_index.json`
names folders, its shard indexes name files, and any entry may be a symlink, a FIFO or a device.
These helpers make sure the engine and the libraries it calls only ever open regular files inside
the directory, and that opening a file can never block (a FIFO is opened non-blocking and refused).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from ..errors import ModelDirError

_KIND = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
         stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symlink"}


def kind_of(mode: int) -> str:
    """'a FIFO', 'a directory', … for a stat mode (what an operator would call it)."""
    return _KIND.get(stat.S_IFMT(mode), "not a regular file")


def check_segment(name: object, where: str) -> str:
    """A component name must be one plain path segment: it becomes a folder name under the model root."""
    if not isinstance(name, str) or not name:
        raise ModelDirError(f"{where}: component name {name!r:.80} is empty or not a string (names are folder names)")
    if name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ModelDirError(f"{where}: component name {name!r:.80} is not a plain folder name "
                            "(paths outside the model directory are never opened)")
    check_name_length(name, f"{where}: component name")
    return name


NAME_MAX = 255  # bytes of one file name on Linux, macOS and Windows file systems


def check_name_length(name: str, where: str) -> None:
    """A folder or file name longer than any file system allows is refused (its path could not even be
    looked up: `File name too long`), shown cut short: such a name can be a megabyte."""
    for part in name.split("/"):
        if len(part.encode("utf-8", "surrogatepass")) > NAME_MAX:
            raise ModelDirError(f"{where} {part!r:.60}… is {len(part.encode('utf-8', 'surrogatepass'))} bytes long "
                                f"(a file name has at most {NAME_MAX})")


def check_relative_file(value: object, where: str) -> str:
    """A file named inside a folder (a shard in `weight_map`): relative, no `..`, no odd characters."""
    if not isinstance(value, str):
        raise ModelDirError(f"{where}: expected a file name, got {type(value).__name__} {value!r:.60}")
    if not value or "\0" in value or "\\" in value or any(p in ("", ".", "..") for p in value.split("/")):
        raise ModelDirError(f"{where}: {value!r:.80} is not a file inside the component folder "
                            "(paths outside the model directory are never opened)")
    check_name_length(value, f"{where}: file name")
    return value


def allowed_roots(root: Path) -> tuple[Path, ...]:
    """Where files of this model may live: its resolved root, plus the blob store of a hub-cache snapshot.

    A model in the Hugging Face cache (`models--org--name/snapshots/<rev>/`) is made of symlinks into
    `models--org--name/blobs/`; that store belongs to the same downloaded repository.
    """
    real = root.resolve()
    roots = [real]
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        roots.append(real.parent.parent / "blobs")
    return tuple(roots)


def _inside(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def is_inside(path: Path, roots: tuple[Path, ...]) -> bool:
    """Whether a path, resolved through every symlink, stays inside the model directory."""
    try:
        return _inside(path.resolve(), roots)
    except (OSError, RuntimeError):
        return False


def check_inside(path: Path, roots: tuple[Path, ...]) -> None:
    """Refuse a path whose resolved target (through any symlink on the way) leaves the model directory."""
    try:
        target = path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise ModelDirError(f"{path}: cannot resolve ({_reason(exc)})") from None
    if not _inside(target, roots):
        raise ModelDirError(f"{path}: points outside the model directory (to {target}; "
                            "files outside the model directory are never opened)")


def check_tree(folder: Path, roots: tuple[Path, ...]) -> list[Path]:
    """Every entry under a component folder: symlinks must stay inside, non-directories must be regular.

    Returns the regular files found (symlinked directories are followed once; loops are cut).
    """
    check_inside(folder, roots)
    files: list[Path] = []
    pending = [folder]
    seen: set[Path] = set()
    while pending:
        current = pending.pop()
        real = current.resolve()
        if real in seen:
            continue
        seen.add(real)
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as exc:
            raise ModelDirError(f"{current}: cannot list ({_reason(exc)})") from None
        for entry in entries:
            path = Path(entry.path)
            if entry.is_symlink():
                check_inside(path, roots)
            try:
                mode = path.stat().st_mode
            except OSError as exc:
                raise ModelDirError(f"{path}: cannot read ({_reason(exc)})") from None
            if stat.S_ISDIR(mode):
                pending.append(path)
            elif stat.S_ISREG(mode):
                files.append(path)
            else:
                raise ModelDirError(f"{path}: is {kind_of(mode)}, not a regular file (only regular files are read)")
    return files


def require_regular(path: Path, what: str = "file") -> None:
    """Refuse a missing, unreadable or non-regular file without ever blocking on it (FIFOs are not opened)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ModelDirError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise ModelDirError(f"{path}: cannot read ({_reason(exc)})") from None
    if not stat.S_ISREG(mode):
        raise ModelDirError(f"{path}: is {kind_of(mode)}, not a regular file (only regular files are read)")
    with open_regular(path):
        pass  # readable: a permission problem is reported here, before a library opens it


def open_regular(path: Path) -> BinaryIO:
    """Open a regular file for reading; a FIFO or device is refused without blocking (O_NONBLOCK + fstat)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        mode = os.stat(path).st_mode  # a FIFO or device is refused before it is ever opened
        if not stat.S_ISREG(mode):
            raise ModelDirError(f"{path}: is {kind_of(mode)}, not a regular file (only regular files are read)")
        fd = os.open(path, flags)  # O_NONBLOCK + fstat below: still safe if the entry is swapped meanwhile
    except FileNotFoundError:
        raise ModelDirError(f"{path}: file not found") from None
    except OSError as exc:
        raise ModelDirError(f"{path}: cannot read ({_reason(exc)})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ModelDirError(f"{path}: is {kind_of(mode)}, not a regular file (only regular files are read)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _reason(exc: BaseException) -> str:
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__
