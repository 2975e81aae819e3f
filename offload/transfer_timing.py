"""Timing of copies and compute-stream waits without CPU synchronization on the hot path.

On CUDA a measurement is a pair of timing events recorded on a stream; the pair is resolved later
with `Event.query()` (never a blocking call) or, at a step boundary where the caller synchronizes
anyway, with `drain()`. On CPU there is nothing asynchronous: the wall time is measured directly
and the measurement is resolved at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

Kind = Literal["copy", "stall", "compute"]  # compute: a streamed block's forward (for traces)


@dataclass(frozen=True, slots=True)
class Measured:
    """A resolved measurement: a copy of `nbytes` to `target`, or a compute wait (stall).

    `t`: `time.monotonic()` of the copy itself — when it finished on a CPU, when it was issued on its
    stream on CUDA — so the staging events of one step keep their own times, not the time they were
    published at (several are resolved together)."""

    kind: Kind
    target: str
    nbytes: int
    seconds: float
    sync: bool
    t: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _Pending:
    kind: Kind
    target: str
    nbytes: int
    sync: bool
    start: Any
    end: Any
    issued: float = field(default_factory=time.monotonic)


class TransferClock:
    """Starts and finishes measurements on a stream (CUDA) or the wall clock (CPU)."""

    def __init__(self, cuda: bool) -> None:
        self._cuda = cuda
        self._pending: list[_Pending] = []
        self._ready: list[Measured] = []

    def start(self, stream: Any = None) -> Any:
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def finish(self, mark: Any, kind: Kind, target: str, nbytes: int, *, sync: bool = False, stream: Any = None) -> Any:
        """Close a measurement; returns the end event on CUDA (usable as a ready event), else None."""
        if not self._cuda:
            self._ready.append(Measured(kind, target, nbytes, time.perf_counter() - mark, sync))
            return None
        end = torch.cuda.Event(enable_timing=True)
        end.record(stream)
        self._pending.append(_Pending(kind, target, nbytes, sync, mark, end))
        return end

    def pending(self) -> int:
        return len(self._pending)

    def poll(self) -> list[Measured]:
        """Measurements that have completed; never blocks."""
        still: list[_Pending] = []
        for p in self._pending:
            if p.end.query():
                self._ready.append(self._resolve(p))
            else:
                still.append(p)
        self._pending = still
        return self._take_ready()

    def drain(self) -> list[Measured]:
        """All measurements, waiting for outstanding ones (for step boundaries and teardown)."""
        for p in self._pending:
            p.end.synchronize()
            self._ready.append(self._resolve(p))
        self._pending = []
        return self._take_ready()

    def discard(self) -> None:
        self._pending = []
        self._ready = []

    def _take_ready(self) -> list[Measured]:
        out, self._ready = self._ready, []
        return out

    @staticmethod
    def _resolve(p: _Pending) -> Measured:
        seconds = max(p.start.elapsed_time(p.end), 0.0) / 1000.0
        return Measured(p.kind, p.target, p.nbytes, seconds, p.sync, p.issued)
