"""Measure the page-cache and O_DIRECT read rates of the file system a checkpoint lives on (`--ram-budget`).

Torch-free, read-only: it reads one of the model's own safetensors files (never writes next to it, never opens
anything outside the model directory), at most `PROBE_BYTES` of it:
- page cache: the region read once to fill the cache, then timed on a second read (pread into one buffer);
- disk: the same region through O_DIRECT (page-aligned offsets, lengths and buffers), `READERS` reads in
  flight all along in `CHUNK`-byte pieces, the way the disk tier reads (offload/tier_filler.py). O_DIRECT
  bypasses the page cache, so the region being cached does not flatter it. A file system without O_DIRECT
  (tmpfs, some FUSE and network mounts: EINVAL) is recorded as such and the disk tier falls back to buffered
  reads at the page cache's rate.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ...offload.file_spans import READ_CHUNK
from ...offload.tiers import BOUNCE_SLOTS, PAGE

PROBE_BYTES = 256 * 2**20  # long enough for a steady rate (NVMe: ~50 ms), short enough for `plan`
CHUNK = READ_CHUNK  # bytes per O_DIRECT read: the engine's disk-tier read (offload/file_spans.py)
READERS = 2 * BOUNCE_SLOTS  # O_DIRECT reads in flight: the engine's disk-tier readers (offload/tier_bounce.py)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """Bytes per second of each read path (None: not measured) and why the disk one is what it is."""

    page_cache: float | None
    disk: float | None
    o_direct: bool
    note: str


def probe_file(model_dir: Path) -> Path | None:
    """The largest safetensors file directly inside the model's component folders (a regular file, not a
    symlink): the one most like what the tiers will read."""
    best: tuple[int, Path] | None = None
    for folder in sorted(p for p in model_dir.iterdir() if p.is_dir() and not p.is_symlink()):
        for f in folder.glob("*.safetensors"):
            if f.is_symlink() or not f.is_file():
                continue
            size = f.stat().st_size
            if best is None or size > best[0]:
                best = (size, f)
    return best[1] if best else None


def _buffered_rate(path: Path, length: int) -> float:
    buf = bytearray(min(CHUNK, length))
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        for _pass in (False, True):  # the first pass fills the page cache
            start = time.perf_counter()
            done = 0
            while done < length:
                n = os.preadv(fd, [view[:min(len(buf), length - done)]], done)
                if n <= 0:
                    break
                done += n
            elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
    return done / max(elapsed, 1e-9)


def _direct_rate(path: Path, length: int) -> float:
    """Bytes/s of O_DIRECT reads of `length` aligned bytes, `READERS` in flight all along; OSError if unsupported.

    Each reader thread has a buffer of its own and takes the next chunk as soon as its read returns, as the
    engine's disk tier keeps its reads queued (offload/tier_filler.py). The probe used to read a batch of
    `READERS` chunks and wait for all of them before the next: every batch waited for its slowest read, and on
    the H100 machine's disk it timed 0.75-0.80 of the disk's sequential rate where the engine's reader reaches
    0.87-0.95 (docs/benchmarks.md), so the plan's disk-bound step floors were a quarter too long."""
    length = length // PAGE * PAGE
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
    local = threading.local()
    buffers: list[mmap.mmap] = []
    lock = threading.Lock()

    def read(off: int) -> int:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = mmap.mmap(-1, CHUNK)  # anonymous maps are page-aligned
            with lock:
                buffers.append(buf)
        size = min(CHUNK, length - off)
        return os.preadv(fd, [memoryview(buf)[:size]], off)

    try:
        start = time.perf_counter()
        with ThreadPoolExecutor(READERS, thread_name_prefix="io-probe") as pool:
            done = sum(pool.map(read, range(0, length, CHUNK)))
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        for b in buffers:
            with contextlib.suppress(BufferError):
                b.close()
    return done / max(elapsed, 1e-9)


def probe_rates(model_dir: Path, files: Sequence[Path] = ()) -> ProbeResult:
    """Both rates on `model_dir`'s file system (see the module docstring), read from the largest of `files` (the
    weight files discovery checked), else of `probe_file`'s."""
    safetensors = [f for f in files if f.suffix == ".safetensors" and f.is_file() and not f.is_symlink()]
    path = max(safetensors, key=lambda f: f.stat().st_size) if safetensors else probe_file(model_dir)
    if path is None:
        return ProbeResult(None, None, False, "no safetensors file to read")
    length = min(path.stat().st_size, PROBE_BYTES)
    if length < PAGE:
        return ProbeResult(None, None, False, f"{path.name} is too small to time")
    cached = _buffered_rate(path, length)
    if not hasattr(os, "O_DIRECT"):
        return ProbeResult(cached, cached, False, "O_DIRECT is not available here: the disk tier reads buffered")
    try:
        direct = _direct_rate(path, length)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        return ProbeResult(cached, cached, False, f"O_DIRECT unsupported on this file system ({why.lower()}): the "
                                                  "disk tier reads buffered, at the page cache's rate")
    return ProbeResult(cached, direct, True, f"read {length // 2**20} MiB of {path.parent.name}/{path.name}")
