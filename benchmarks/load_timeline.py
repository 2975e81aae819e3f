"""Where a load's time goes: bytes read per component and seconds spent page-locking, in time bins.

The load reports its phases summed over threads; that cannot tell a registering thread waiting for
reads from reads slowed by registering, or which component's reads hold the load up. This records,
by wrapping the two functions every load goes through (benchmark only, never the engine):
- each chunk read (`deferred_weights._read_exactly`): when it ended, its bytes, its component
  (the folder of the file it came from);
- each `cudaHostRegister` (`HostArena._register`): when it started and ended, its bytes.
`summary()` bins them (100 ms by default) so one line per bin shows how the load was spent.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omni_console.offload import deferred_weights, pinned


class LoadTimeline:
    """Chunk reads and registrations of one load, relative to `start`."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.reads: list[tuple[float, int, str]] = []  # (end, bytes, component)
        self.registers: list[tuple[float, float, int]] = []  # (start, end, bytes)
        self._lock = threading.Lock()
        self.samples: list[tuple[float, str]] = []  # (time, where the loading thread was) while sampling

    def summary(self, bin_s: float = 0.1) -> dict[str, Any]:
        """GB read per component and register-busy seconds per bin, and when each component's reads ended."""
        read_bins: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        for end, nbytes, component in self.reads:
            read_bins[component][int((end - self.start) / bin_s)] += nbytes / 1e9
        busy: dict[int, float] = defaultdict(float)
        for lo, hi, _ in self.registers:  # split each registration over the bins it spans
            lo, hi = max(lo - self.start, 0.0), max(hi - self.start, 0.0)
            for b in range(int(lo / bin_s), int(hi / bin_s) + 1):  # whole bins: no float loop to get stuck in
                busy[b] += max(0.0, min(hi, (b + 1) * bin_s) - max(lo, b * bin_s))
        last = max([*(b for bins in read_bins.values() for b in bins), *busy, 0])
        return {
            "bin_s": bin_s,
            "read_gb": {c: [round(bins.get(b, 0.0), 3) for b in range(last + 1)] for c, bins in read_bins.items()},
            "register_busy_s": [round(busy.get(b, 0.0), 3) for b in range(last + 1)],
            "reads_end_s": {c: round(max(e for e, _, comp in self.reads if comp == c) - self.start, 3)
                            for c in read_bins},
            "registers_end_s": round(max((hi for _, hi, _ in self.registers), default=self.start) - self.start, 3),
            "register_calls": len(self.registers),
            "registers": [[round(lo - self.start, 3), round(hi - self.start, 3), round(n / 1e9, 3)]
                          for lo, hi, n in sorted(self.registers)],  # (start s, end s, GB) of each call
            "loading_thread": self.where(),
        }

    def where(self, bin_s: float = 0.05) -> list[list[Any]]:
        """Per bin of the sampled span: the loading thread's three most frequent places and their counts."""
        bins: dict[int, Counter[str]] = defaultdict(Counter)
        for t, place in self.samples:
            bins[int((t - self.start) / bin_s)][place] += 1
        return [[round(b * bin_s, 2), bins[b].most_common(3)] for b in sorted(bins)]


def _place(frame: Any, depth: int = 4) -> str:
    """The innermost `depth` frames as file:function, innermost first."""
    parts = []
    while frame is not None and len(parts) < depth:
        parts.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}")
        frame = frame.f_back
    return " < ".join(parts)


def _sample(timeline: LoadTimeline, ident: int, stop: threading.Event, every_s: float, until_s: float) -> None:
    while not stop.wait(every_s) and time.perf_counter() - timeline.start < until_s:
        frame = sys._current_frames().get(ident)
        if frame is not None:
            timeline.samples.append((time.perf_counter(), _place(frame)))


def mapping_facts() -> dict[str, float]:
    """This process's memory map now: how many mappings (page-locking ranges may split the arena's) and
    how many GB sit on transparent huge pages (splitting a mapping mid huge page breaks that page up)."""
    facts: dict[str, float] = {}
    try:
        with open("/proc/self/maps") as maps:
            facts["mappings"] = sum(1 for _ in maps)
        with open("/proc/self/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("AnonHugePages:"):
                    facts["anon_huge_gb"] = round(int(line.split()[1]) * 1024 / 1e9, 3)
    except OSError:
        pass
    return facts


def _component_of(fd: int) -> str:
    try:
        return os.path.basename(os.path.dirname(os.readlink(f"/proc/self/fd/{fd}")))
    except OSError:
        return "?"


@contextmanager
def recording(sample_s: float = 0.0) -> Iterator[LoadTimeline]:
    """Record every chunk read and registration until the block ends, and with `sample_s` where the
    calling (loading) thread is, every 5 ms for its first `sample_s` seconds."""
    timeline = LoadTimeline()
    stop = threading.Event()
    if sample_s > 0:
        threading.Thread(target=_sample, args=(timeline, threading.get_ident(), stop, 0.005, sample_s),
                         daemon=True).start()
    read_exactly, register = deferred_weights._read_exactly, pinned.HostArena._register

    def timed_read(fd: int, offset: int, view: memoryview) -> None:
        read_exactly(fd, offset, view)
        row = (time.perf_counter(), len(view), _component_of(fd))
        with timeline._lock:
            timeline.reads.append(row)

    def timed_register(self: pinned.HostArena, ptr: int, nbytes: int) -> str | None:
        t0 = time.perf_counter()
        try:
            return register(self, ptr, nbytes)
        finally:
            with timeline._lock:
                timeline.registers.append((t0, time.perf_counter(), nbytes))

    deferred_weights._read_exactly, pinned.HostArena._register = timed_read, timed_register
    try:
        yield timeline
    finally:
        stop.set()
        deferred_weights._read_exactly, pinned.HostArena._register = read_exactly, register


def one_line_per_bin(summary: dict[str, Any]) -> list[str]:
    """The summary as text: a row per bin with GB read per component and registering seconds."""
    comps = sorted(summary["read_gb"])
    rows = [f"{'t':>5} " + " ".join(f"{c[:12]:>12}" for c in comps) + "  register"]
    for b, busy in enumerate(summary["register_busy_s"]):
        t = b * summary["bin_s"]
        reads = " ".join(f"{summary['read_gb'][c][b]:12.2f}" for c in comps)
        rows.append(f"{t:5.1f} {reads}  {busy:8.2f}")
    return rows
