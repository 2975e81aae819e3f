"""Run one command as a child and measure its host memory (and, on a GPU, its device memory) to the end.

Issue 35 judges a run by its peak RSS. Three readings, since each can miss something:
- `VmHWM` from /proc/PID/status, polled (the kernel's own high-water mark of RSS, file pages included);
- `ru_maxrss` of that one child from `os.wait4` (not RUSAGE_CHILDREN: the host limiter is a child too);
- the polled split of RSS (anonymous, file-backed, shared; locked `VmLck`, pinned `VmPin`), whose
  anonymous + shared peak is the part the kernel cannot drop.
With `nvml_index`, NVML's per-process device peak is sampled too (benchmarks/real_cards.py's sampler).
A run past `timeout` is killed and says so.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_STATUS_KEYS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem", "VmLck", "VmPin")


def status_fields(pid: int) -> dict[str, int]:
    """The memory fields of /proc/PID/status that we track, in bytes."""
    text = Path(f"/proc/{pid}/status").read_text()
    out = {}
    for key in _STATUS_KEYS:
        match = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
        if match:
            out[key] = int(match.group(1)) * 1024
    return out


@dataclass
class Watched:
    """What one child did: exit code, output, wall time and its memory peaks (bytes; None: not measured)."""

    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool = False
    peaks: dict[str, int] = field(default_factory=dict)  # each status field's largest sample
    unreclaimable_peak: int | None = None  # max over samples of RssAnon + RssShmem
    rusage_maxrss: int | None = None
    samples: int = 0
    nvml: dict[str, int | None] = field(default_factory=dict)

    @property
    def peak_rss(self) -> int | None:
        """The child's peak RSS: the largest of its high-water mark, its rusage and the samples."""
        seen = [v for v in (self.peaks.get("VmHWM"), self.peaks.get("VmRSS"), self.rusage_maxrss) if v]
        return max(seen) if seen else None

    def summary(self) -> dict[str, Any]:
        return {"returncode": self.returncode, "wall_s": round(self.wall_s, 3), "timed_out": self.timed_out,
                "peak_rss": self.peak_rss, "unreclaimable_peak": self.unreclaimable_peak,
                "rusage_maxrss": self.rusage_maxrss, "status_peaks": self.peaks, "samples": self.samples,
                **self.nvml}


def _nvml_sampler(index: int | None) -> Any:
    if index is None:
        return None
    try:
        from .real_cards import NvmlSampler

        return NvmlSampler(index)
    except Exception:  # noqa: BLE001 - no NVML library or no device: the host figures still count
        return None


def _oom_first(score: int) -> Callable[[], None]:
    def set_score() -> None:  # in the child, before exec: raising one's own score needs no privilege
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(score))

    return set_score


def run_watched(cmd: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float | None = None,
                interval: float = 0.05, nvml_index: int | None = None, oom_score_adj: int | None = None) -> Watched:
    """Run `cmd` to its end (or `timeout`), sampling its memory every `interval` seconds.

    `oom_score_adj` (1000: the kernel's first choice) makes the child the process the OOM killer takes
    when a simulated host runs out: without it the killer takes the largest, the host limiter, and the
    host silently grows back (the limiter cannot lower its own score without CAP_SYS_RESOURCE)."""
    sampler = _nvml_sampler(nvml_index)  # its baseline: before the child starts
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(env) if env is not None else None,
                            preexec_fn=None if oom_score_adj is None else _oom_first(oom_score_adj))
    if sampler is not None:
        sampler.pid = proc.pid
        sampler.start()
    out: dict[str, str] = {}

    def drain(name: str) -> None:
        out[name] = getattr(proc, name).read()

    readers = [threading.Thread(target=drain, args=(n,), daemon=True) for n in ("stdout", "stderr")]
    for r in readers:
        r.start()
    peaks: dict[str, int] = {}
    unreclaimable, samples, timed_out, exited = None, 0, False, None
    while exited is None:
        try:
            fields = status_fields(proc.pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            fields = {}
        if fields.get("VmRSS") is not None:  # a zombie has no memory lines
            samples += 1
            for key, value in fields.items():
                peaks[key] = max(peaks.get(key, 0), value)
            anon = fields.get("RssAnon", 0) + fields.get("RssShmem", 0)
            unreclaimable = anon if unreclaimable is None else max(unreclaimable, anon)
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            exited = (status, usage)
            break
        if timeout is not None and time.perf_counter() - t0 > timeout:
            timed_out = True
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            exited = (status, usage)
            break
        time.sleep(interval)
    status, usage = exited
    proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for it again
    wall = time.perf_counter() - t0
    for r in readers:
        r.join(timeout=10)
    nvml = sampler.stop() if sampler is not None else {}
    return Watched(proc.returncode, out.get("stdout", ""), out.get("stderr", ""), wall, timed_out, peaks,
                   unreclaimable, usage.ru_maxrss * 1024, samples, nvml)
