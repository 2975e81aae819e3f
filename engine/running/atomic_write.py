"""Files appear complete under their final name, or not at all, whatever signal ends the process.

Every output (an image, an animation, a video, a frame of a sequence) is written into a temporary
file beside its final name (`.NAME.XXXX.tmp`) and only then put in place:
- a new file with `os.link(temp, final)`, which fails if `final` exists (so a file that appeared
  meanwhile, the operator's or another process's, is never replaced); the temporary name is then
  removed. On a file system without hard links an exclusive claim (`O_EXCL`) is renamed over instead.
- with overwrite, `os.replace(temp, final)`, one atomic step.

Temporaries (and scratch folders) are registered while they exist. A process that ends without
unwinding (the console's `os._exit` after `q` or SIGTERM, with the engine thread mid-write) calls
`remove_pending()` first; `run` and `demo-model` turn SIGTERM/SIGHUP into exceptions (`SignalGuard`)
so the `finally` here removes them. Nothing but what this module created is ever removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from .signal_guard import held

_lock = threading.Lock()
_pending: dict[Path, bool] = {}  # path -> is a folder; what remove_pending() may delete
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}


def _register(path: Path, folder: bool = False) -> None:
    with _lock:
        _pending[path] = folder


def _forget(path: Path) -> None:
    with _lock:
        _pending.pop(path, None)


def remove_pending() -> None:
    """Remove every temporary file and scratch folder still being written (before `os._exit`)."""
    with _lock:
        items = list(_pending.items())
        _pending.clear()
    for path, folder in items:
        with contextlib.suppress(OSError):
            if folder:
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink()


@contextlib.contextmanager
def scratch_folder(beside: Path) -> Iterator[Path]:
    """A fresh registered folder beside `beside` (same file system), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=f".{beside.name}.", suffix=".tmp", dir=beside.parent))
    _register(folder, folder=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        _forget(folder)


@contextlib.contextmanager
def _temp_beside(path: Path) -> Iterator[tuple[BinaryIO, Path]]:
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    temp = Path(name)
    _register(temp)
    try:
        with os.fdopen(fd, "wb") as stream:
            yield stream, temp
    finally:
        with contextlib.suppress(OSError):
            temp.unlink()
        _forget(temp)


def publish_new(temp: Path, path: Path) -> None:
    """Put the complete file `temp` at `path` only if `path` does not exist (FileExistsError otherwise).

    `temp` stays (the caller removes it); on a file system without hard links it is moved instead."""
    try:
        os.link(temp, path)
        return
    except OSError as exc:
        if isinstance(exc, FileExistsError) or exc.errno not in _NO_LINKS:
            raise
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # no hard links: claim, then rename over
    os.close(fd)
    _register(path)
    try:
        os.replace(temp, path)
    except BaseException:
        path.unlink(missing_ok=True)  # our own empty claim
        raise
    finally:
        _forget(path)


def _nothing() -> None:
    return None


def write_new(path: Path, write: Callable[[BinaryIO], None], mode: int = 0o666, *,
              published: Callable[[], None] = _nothing) -> None:
    """Write a new file at `path` (FileExistsError if it exists, before or after the write).

    Putting it in place and `published()` form one step that signals wait for (`signal_guard.held`)."""
    with _temp_beside(path) as (stream, temp):
        write(stream)
        stream.flush()
        os.fchmod(stream.fileno(), mode & ~_umask())
        stream.close()
        with held():
            publish_new(temp, path)
            published()


def write_replacing(path: Path, write: Callable[[BinaryIO], None], *,
                    published: Callable[[], None] = _nothing) -> None:
    """Write `path`, replacing what is there in one step (keeping its permission bits); `published()`
    runs in the same step."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    with _temp_beside(path) as (stream, temp):
        write(stream)
        stream.flush()
        os.fchmod(stream.fileno(), mode)
        stream.close()
        with held():
            os.replace(temp, path)
            published()


def file_mode(path: Path, overwrite: bool) -> int:
    """The permission bits a file written at `path` gets: the replaced file's, else 0o666 less the umask."""
    if overwrite:
        with contextlib.suppress(OSError):
            return stat.S_IMODE(os.stat(path).st_mode)
    return 0o666 & ~_umask()


def _umask() -> int:
    with _lock:  # os.umask can only be read by setting it; keep two threads from racing on it
        current = os.umask(0)
        os.umask(current)
    return current
