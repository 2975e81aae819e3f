"""A checkpoint's files and the kernel's page cache: drop it, check it, and time reads through and around it.

Issue 35's cold runs start with the checkpoint out of the page cache, and its step forecast divides each
tier's bytes by that tier's measured rate. This module gives the harness (benchmarks/host_tiers.py):

- `checkpoint_files(root)`: every regular file under a model directory (no symlink followed out of it);
- `drop(files)`: `posix_fadvise(DONTNEED)` on each file (after `fsync`, as dirty pages are not dropped);
- `cached_bytes(files)`: how much of them the page cache holds, by `mincore` on a read-only mapping
  (what `fincore` does), so a drop is checked, not assumed;
- `read_rate(files, ...)`: bytes per second of reading them with several reads in flight (threads, each
  with its own page-aligned buffer, `preadv` of large chunks), either with O_DIRECT (around the cache)
  or buffered (through it: cold after a drop, or warm when cached).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

PAGE = mmap.PAGESIZE
CHUNK = 64 * 2**20  # bytes per read (sglang's O_DIRECT chunk)
DEPTH = 8  # reads in flight

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
_MAP_FAILED = ctypes.c_void_p(-1).value


def checkpoint_files(root: Path) -> list[Path]:
    """Regular files under `root`, sorted, none reached through a symlink."""
    root = Path(root)
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()
                  and not any(q.is_symlink() for q in p.relative_to(root).parents if q != Path(".")))


def drop(files: Iterable[Path]) -> None:
    """Ask the kernel to drop the files' cached pages (written pages are flushed first)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_bytes(path: Path) -> int:
    """Bytes of `path` in the page cache now (mincore over a read-only shared mapping)."""
    size = path.stat().st_size
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path.name} failed")
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = ctypes.create_string_buffer(pages)
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path.name} failed")
            resident = sum(b & 1 for b in vec.raw)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)
    return min(size, resident * PAGE)


@dataclass(frozen=True, slots=True)
class CacheState:
    """How much of a file set the page cache holds."""

    total_bytes: int
    cached_bytes: int

    @property
    def fraction(self) -> float:
        return self.cached_bytes / self.total_bytes if self.total_bytes else 0.0


def cache_state(files: Sequence[Path]) -> CacheState:
    return CacheState(sum(p.stat().st_size for p in files), sum(cached_bytes(p) for p in files))


@dataclass(frozen=True, slots=True)
class ReadRate:
    """One timed read of a file set: bytes, seconds, bytes per second, how it was read."""

    nbytes: int
    seconds: float
    direct: bool
    depth: int
    chunk: int

    @property
    def bytes_per_s(self) -> float:
        return self.nbytes / self.seconds if self.seconds > 0 else 0.0


def _chunks(files: Sequence[Path], limit: int | None, chunk: int) -> list[tuple[Path, int, int]]:
    """(file, offset, length) pieces of the files in order, at most `limit` bytes (whole pages)."""
    pieces, total = [], 0
    for path in files:
        size = path.stat().st_size
        for offset in range(0, size, chunk):
            if limit is not None and total >= limit:
                return pieces
            length = min(chunk, size - offset)
            pieces.append((path, offset, length))
            total += length
    return pieces


def read_rate(files: Sequence[Path], *, direct: bool, limit: int | None = None, depth: int = DEPTH,
              chunk: int = CHUNK) -> ReadRate:
    """Read up to `limit` bytes of `files` (in order) with `depth` reads in flight and time it.

    `direct`: O_DIRECT, page-aligned offsets, buffers and lengths (a tail is read as whole pages; the
    short read at the end of the file is what counts). Raises OSError where the filesystem refuses
    O_DIRECT (tmpfs)."""
    if chunk % PAGE:
        raise ValueError("the chunk must be whole pages")
    pieces = _chunks(files, limit, chunk)
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    fds = {p: os.open(p, flags) for p in dict.fromkeys(path for path, _, _ in pieces)}
    work: queue.SimpleQueue[tuple[Path, int, int] | None] = queue.SimpleQueue()
    for piece in pieces:
        work.put(piece)
    done, errors, lock = [0], [], threading.Lock()

    def reader() -> None:
        buf = mmap.mmap(-1, chunk)  # anonymous: page-aligned, as O_DIRECT needs
        view = memoryview(buf)
        try:
            while (item := work.get()) is not None:
                path, offset, length = item
                want = (length + PAGE - 1) // PAGE * PAGE if direct else length
                got = os.preadv(fds[path], [view[:want]], offset)
                with lock:
                    done[0] += min(got, length)
        except OSError as exc:
            errors.append(exc)
        finally:
            view.release()
            buf.close()

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(max(1, depth))]
    for _ in threads:
        work.put(None)
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    if errors:
        raise errors[0]
    return ReadRate(done[0], seconds, direct, depth, chunk)
