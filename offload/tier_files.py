"""The weight files that file-tier blocks are read from during a run, and the reads themselves.

The load opened each safetensors file once (read-only, no symlink followed, inside the model directory:
`engine.model_dir.safe_paths`) and closes those descriptors when it ends. File-tier blocks need them for
the whole run, so each is kept here as a duplicate of the load's descriptor (`os.dup`: the same open
file, no path resolved again) and, for the `disk` tier, a second descriptor with O_DIRECT, reopened
through the process's own `/proc/self/fd` entry and checked to be the same file (device and inode).

Where O_DIRECT is refused (EINVAL: tmpfs on older kernels, some network file systems) the disk tier
reads through the page cache instead, says so once, and drops the pages it read (`POSIX_FADV_DONTNEED`)
so that it still does not fill the cache. A file whose size or modification time differs from what it
was at the load has changed under the run: the read fails with one line naming it (`FileChanged`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .file_spans import Run
from .tiers import Tier


class FileChanged(OSError):
    """A weight file changed (shrank, was rewritten) after the load: its bytes are no longer the model's."""


@dataclass(slots=True)
class _File:
    name: str
    buffered: int
    direct: int | None
    size: int
    mtime_ns: int


def _name_of(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    return "a weights file"


def open_direct(fd: int) -> int:
    """A second descriptor of `fd`'s file with O_DIRECT (raises OSError where the file system refuses)."""
    direct = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_DIRECT", 0))
    a, b = os.fstat(fd), os.fstat(direct)
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
        os.close(direct)
        raise OSError(errno.ESTALE, "reopened descriptor names another file")
    return direct


class TierFiles:
    """The run's weight files by key (see the module docstring); `read` fills one aligned run."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self._log = log
        self._files: list[_File] = []
        self._by_fd: dict[int, int] = {}
        self._lock = threading.Lock()
        self._said_buffered = False

    def add(self, fd: int, *, direct: bool) -> int:
        """Keep `fd`'s file for the run (a duplicate; O_DIRECT too when `direct`); returns its key."""
        key = self._by_fd.get(fd)
        if key is None:
            st = os.fstat(fd)
            dup = os.dup(fd)
            self._files.append(_File(_name_of(fd), dup, None, st.st_size, st.st_mtime_ns))
            key = self._by_fd[fd] = len(self._files) - 1
        f = self._files[key]
        if direct and f.direct is None and not self._said_buffered:
            try:
                f.direct = open_direct(f.buffered)
            except OSError as exc:
                self._buffered_instead(exc)
        return key

    @property
    def direct(self) -> bool:
        """Whether disk-tier reads bypass the page cache (False once O_DIRECT was refused)."""
        return not self._said_buffered

    def _buffered_instead(self, exc: OSError) -> None:
        with self._lock:
            if self._said_buffered:
                return
            self._said_buffered = True
        for f in self._files:
            if f.direct is not None:
                with contextlib.suppress(OSError):
                    os.close(f.direct)
                f.direct = None
        self._log(f"O_DIRECT refused here ({os.strerror(exc.errno or errno.EINVAL)}): disk-tier blocks are read "
                  "through the page cache, which is told to drop them after each read")

    def read(self, run: Run, slot: memoryview, tier: Tier) -> int:
        """Read `run` into `slot` (a bounce slot, page-aligned); returns the bytes read."""
        f = self._files[run.file]
        view = slot[run.slot_offset : run.slot_offset + run.length]
        done = 0
        while done < run.needed:
            fd = f.direct if tier == "disk" and f.direct is not None else f.buffered
            try:
                got = os.preadv(fd, [view[done:]], run.start + done)
            except OSError as exc:
                if exc.errno == errno.EINVAL and fd != f.buffered:
                    self._buffered_instead(exc)
                    continue
                raise
            if got == 0:
                raise FileChanged(f"{f.name} ended {run.needed - done:,} bytes early: it changed on disk after "
                                  "the load; load the model again")
            done += got
        if tier == "disk" and f.direct is None:
            with contextlib.suppress(OSError, AttributeError):
                os.posix_fadvise(f.buffered, run.start, run.length, os.POSIX_FADV_DONTNEED)
        self._check(f)
        return done

    def _check(self, f: _File) -> None:
        st = os.fstat(f.buffered)
        if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
            raise FileChanged(f"{f.name} changed on disk after the load (size or modification time): its blocks "
                              "are no longer the loaded model's; load the model again")

    def close(self) -> None:
        files, self._files, self._by_fd = self._files, [], {}
        for f in files:
            for fd in (f.direct, f.buffered):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
