"""Where omni-console keeps what it can rebuild (the demo model, request profiles), and how it reads it.

Its own module without torch, so `plan` can find a cached profile without importing it.

The cache is input too: another program, another user on a shared home, or a careless `ln -s` may
have put a FIFO, a device, a symlink to `/dev/zero` or a huge file where a profile belongs. Every
cache file is read through `read_cache_file`: regular files only, never a symlink, opened without
blocking, and never more than a fixed number of bytes. A file that fails is ignored with a reason.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

CACHE_ENV = "OMNI_CONSOLE_CACHE_DIR"


class CacheFileError(Exception):
    """A cache file that cannot be used; the message is the short reason (it is then ignored)."""


def cache_root() -> Path:
    """Root of omni-console's cache: ``$OMNI_CONSOLE_CACHE_DIR`` or the platform user cache dir."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("omni-console", appauthor=False))


_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))


def read_cache_file(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of a cache file, None when it does not exist; `CacheFileError` for anything else.

    O_NOFOLLOW refuses a symlink (we never write one), O_NONBLOCK keeps a FIFO from hanging the open,
    fstat on the opened descriptor refuses a FIFO, device or directory swapped in after any check,
    and the read stops at `max_bytes + 1` so `/dev/zero` or a huge file cannot exhaust memory.
    """
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise CacheFileError("is a symbolic link (cache files are never followed)") from None
        raise CacheFileError(f"cannot be read ({(exc.strerror or str(exc)).lower()})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheFileError("is not a regular file")
        if st.st_size > max_bytes:
            raise CacheFileError(f"is larger than {max_bytes} bytes")
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise CacheFileError(f"is larger than {max_bytes} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise CacheFileError(f"cannot be read ({(exc.strerror or str(exc)).lower()})") from None
    finally:
        os.close(fd)


def write_cache_file(path: Path, text: str, prefix: str) -> Path:
    """Replace the cache file `path` with `text` atomically (a temporary `prefix`…`.tmp` beside it, then
    renamed over it): a reader never sees half a file, and a failed write leaves no temporary behind."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
