"""The engine's own disk-tier reader, timed on a checkpoint's files (issue 35: "O_DIRECT reads reach >= 0.9x the
disk's measured sequential rate").

A file-tier block in a run (offload/tier_filler.py) is its safetensors byte ranges widened to whole pages
(`file_spans.plan_runs`), split into `READ_CHUNK` reads (`file_spans.chunks`), each read by one of the run's
reader threads (`tier_filler.READERS`, 2 x `BOUNCE_SLOTS`) with `TierFiles.read` through the O_DIRECT descriptor
`TierFiles.add` reopens, into a page-aligned bounce slot; at most `BOUNCE_SLOTS` blocks are in flight. Here those
same calls read the first `limit` bytes of the files as blocks of `block` bytes each, with no device copy (a slot
is free again once its reads are done): the reader's rate, without the link's. The engine's `plan` probe
(engine/planning/io_probe.py, what the tier plan assumes) reads 256 MiB in 16 MiB pieces, 4 in flight, its own
way; this is the code a run's disk tier actually reads with. Torch-free (the harness never imports torch).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

BLOCK = 512 * 2**20  # bytes per simulated block (a Wan-14B bf16 block is 0.70 GB, fp8 0.35 GB; Flux's 0.3-0.6 GB)


@dataclass(frozen=True, slots=True)
class ReaderRate:
    """Bytes the engine's reader returned, the seconds from the first read to the last, and how it read."""

    nbytes: int
    seconds: float
    o_direct: bool  # False: the file system refused O_DIRECT and TierFiles read buffered (then dropped the pages)
    readers: int
    chunk_bytes: int
    block_bytes: int
    slots: int
    note: str = ""

    @property
    def bytes_per_s(self) -> float:
        return self.nbytes / max(self.seconds, 1e-9)


def reader_threads() -> int:
    """`offload/tier_filler.READERS` without importing torch (tests/benchmarks holds the two equal)."""
    from omni_console.offload.tiers import BOUNCE_SLOTS

    return 2 * BOUNCE_SLOTS


def engine_reader_rate(files: Sequence[Path], *, limit: int | None = None, block: int = BLOCK) -> ReaderRate:
    """Time the engine's disk-tier reads (`TierFiles.read`, O_DIRECT) of the first `limit` bytes of `files`."""
    from omni_console.offload.file_spans import READ_CHUNK, Extent, chunks, plan_runs
    from omni_console.offload.tier_files import TierFiles
    from omni_console.offload.tiers import BOUNCE_SLOTS

    notes: list[str] = []
    reader = TierFiles(notes.append)
    fds: list[int] = []
    try:
        extents: list[Extent] = []
        left = limit if limit is not None else sum(p.stat().st_size for p in files)
        for path in files:
            if left <= 0:
                break
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
            fds.append(fd)
            key = reader.add(fd, direct=True)
            size = os.fstat(fd).st_size
            for offset in range(0, size, block):
                n = min(block, size - offset, left)
                if n <= 0:
                    break
                extents.append(Extent(key, offset, n))
                left -= n
        blocks = [plan_runs([e]) for e in extents]
        slot_bytes = max((used for _, _, used in blocks), default=0)
        if not slot_bytes:
            return ReaderRate(0, 0.0, reader.direct, reader_threads(), READ_CHUNK, block, BOUNCE_SLOTS, "no bytes")
        ring = mmap.mmap(-1, BOUNCE_SLOTS * slot_bytes)  # anonymous: page-aligned, as O_DIRECT needs
        zeros = bytes(min(len(ring), 64 * 2**20))
        for at in range(0, len(ring), len(zeros)):  # its pages exist before the clock starts, as a pinned ring's do
            ring[at : at + len(zeros)] = zeros[: len(ring) - at]
        nbytes = 0
        with ThreadPoolExecutor(reader_threads(), thread_name_prefix="tier-read") as pool:
            view = memoryview(ring)
            pending: deque[list[Future[int]]] = deque()
            start = time.perf_counter()
            for i, (runs, _where, _used) in enumerate(blocks):
                if len(pending) == BOUNCE_SLOTS:  # the oldest block's slot is this one: its reads must be done
                    nbytes += sum(f.result() for f in pending.popleft())
                at = i % BOUNCE_SLOTS * slot_bytes
                slot = view[at : at + slot_bytes]
                pending.append([pool.submit(reader.read, piece, slot, "disk") for run in runs for piece in chunks(run)])
            while pending:
                nbytes += sum(f.result() for f in pending.popleft())
            seconds = time.perf_counter() - start
            del slot, view
        with contextlib.suppress(BufferError):
            ring.close()
        return ReaderRate(nbytes, seconds, reader.direct, reader_threads(), READ_CHUNK, block, BOUNCE_SLOTS,
                          "; ".join(notes)[:300])
    finally:
        reader.close()
        for fd in fds:
            os.close(fd)
