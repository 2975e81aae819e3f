"""The leader of a multi-GPU engine: starts N rank processes and drives them as one engine.

Each rank (`engine.ranks.rank_process`) joins torch.distributed through the environment a `torchrun`
worker gets, and serves one `Engine` whose streamed blocks are sharded across the group (AllGather)
or whole on every rank (rank-local). Data-parallel requests go one per rank, at once: the ranks
stream, gather and compute in lockstep, which the AllGather collectives require.

The ranks' events are published as they arrive, by one reader thread (telemetry keeps flowing
between commands); a rank sends a command's events before its answer, so they are on the bus when
the command returns. Nothing here can hang the caller on a dead rank: every wait polls the processes, and a rank that
exits or reports an error stops the whole group (its processes end, so every rank's device and
pinned memory is released) and raises `RankFailed` with one line.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...offload.events import Event, EventBus
from ...offload.policy import OffloadPolicy
from ..options import EngineOptions
from ..running.runner import GenerateRequest
from .rank_layout import RankLayout
from .rank_process import RankSpec, rank_main

POLL_S = 0.1
STOP_GRACE_S = 10.0


class RankFailed(RuntimeError):
    """A rank died or failed; the group has been stopped."""


class GroupCancelled(RankFailed):
    """The caller cancelled a command; the group has been stopped (the ranks compute in lockstep, so
    one cannot stop at a step while another waits for it in a collective: all stop)."""


@contextlib.contextmanager
def _real_stderr() -> Iterator[None]:
    """`spawn` (of a rank, or of multiprocessing's resource tracker) hands the child
    `sys.stderr.fileno()`; under a Textual app `sys.stderr` is a capture whose descriptor is -1,
    so the process's own stderr stands in while the ranks start."""
    try:
        valid = sys.stderr.fileno() >= 0
    except (AttributeError, OSError, ValueError):
        valid = False
    if valid:
        yield
        return
    captured = sys.stderr
    sys.stderr = sys.__stderr__ if sys.__stderr__ is not None else open(os.devnull, "w")  # noqa: SIM115
    try:
        yield
    finally:
        sys.stderr = captured


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankGroup:
    """N rank processes serving one model; `load`, `generate` and `close` address them all."""

    def __init__(self, model_path: str | Path, layout: RankLayout, device_kind: str, *, variant: str | None = None,
                 bus: EventBus | None = None, start_timeout_s: float = 300.0,
                 on_event: Callable[[int, Event], None] | None = None, telemetry_hz: float | None = None,
                 log_dir: Path | None = None, cancel: threading.Event | None = None,
                 options: EngineOptions | None = None) -> None:
        """Starts the ranks and returns once every one is ready (its classes imported); `cancel` stops them.
        `options`: every rank's `EngineOptions` (None: the defaults, the readers shared out between ranks)."""
        self.layout = layout
        self.bus = bus or EventBus()
        self.on_event = on_event
        ctx = mp.get_context("spawn")  # CUDA cannot be forked
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(layout.gpus)}
        spec = RankSpec(Path(model_path), device_kind, layout.allgather, variant, env, layout.parallel, telemetry_hz,
                        log_dir, options)
        self.closed = False
        with _real_stderr():  # the queues' semaphores start multiprocessing's resource tracker: a spawn too
            self._replies = ctx.Queue()
            self._commands = [ctx.Queue() for _ in range(layout.gpus)]
            self._procs = [ctx.Process(target=rank_main, args=(r, spec, self._commands[r], self._replies),
                                       name=f"omni-rank-{r}", daemon=True) for r in range(layout.gpus)]
            for p in self._procs:
                p.start()
        # one reader of the ranks' queue, always: events (telemetry between commands too) reach the bus
        # as they arrive, answers wait for `_collect`
        self._answers: queue.Queue[tuple[str, int, Any]] = queue.Queue()
        self._pump_stop = threading.Event()
        self._pump = threading.Thread(target=self._pump_replies, name="omni-rank-events", daemon=True)
        self._pump.start()
        self._collect("start", start_timeout_s, cancel)

    @property
    def world(self) -> int:
        return self.layout.gpus

    def load(self, policy: OffloadPolicy, timeout_s: float = 3600.0, cancel: threading.Event | None = None
             ) -> list[Any]:
        """Every rank loads the model under `policy`; their `LoadReport`s, by rank. `cancel` stops the group."""
        for q in self._commands:
            q.put(("load", policy))
        return self._collect("load", timeout_s, cancel)

    def generate(self, requests: Sequence[GenerateRequest], timeout_s: float = 3600.0,
                 cancel: threading.Event | None = None) -> list[Any]:
        """One request per rank, run at once; their `GenerateResult`s, by rank. Data-parallel: N
        requests; CFG-parallel: the same request on both ranks (each result is the whole image).

        The ranks gather blocks in lockstep, so every request must denoise the same number of steps
        at the same size (prompts and seeds may differ)."""
        if self.layout.parallel == "cfg" and any(r != requests[0] for r in requests):
            raise ValueError("CFG-parallel ranks run one request together: give the same request to both")
        if len(requests) != self.world:
            raise ValueError(f"{self.world} ranks take {self.world} requests, got {len(requests)}")
        shapes = {(r.steps, r.height, r.width, r.frames) for r in requests}
        if len(shapes) > 1:
            raise ValueError("data-parallel requests must share steps, height, width and frames")
        for q, request in zip(self._commands, requests, strict=True):
            q.put(("generate", request))
        return self._collect("generate", timeout_s, cancel)

    def unload(self, timeout_s: float = 600.0) -> None:
        for q in self._commands:
            q.put(("unload", None))
        self._collect("unload", timeout_s)

    def close(self) -> None:
        """Ask every rank to release and exit; stop the ones that do not. Idempotent."""
        if self.closed:
            return
        self.closed = True
        for q in self._commands:
            with contextlib.suppress(Exception):
                q.put(("close", None))
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self._kill()
        self._end_pump()

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _collect(self, what: str, timeout_s: float, cancel: threading.Event | None = None) -> list[Any]:
        """One answer per rank; events are published as they come. Any failure, or `cancel`, stops the group."""
        if self.closed:
            raise RankFailed("the rank group is stopped")
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(results) < self.world:
            if cancel is not None and cancel.is_set():
                self._stop(f"{what} cancelled: every rank stopped", GroupCancelled)
            try:
                kind, rank, payload = self._answers.get(timeout=POLL_S)
            except queue.Empty:
                self._check_alive(what)
                if time.monotonic() > deadline:
                    self._stop(f"{what} timed out after {timeout_s:.0f} s")
                continue
            if kind == "error":
                self._stop(self._dead_rank(what) or payload)  # a peer's error is often the dead rank's echo
            else:
                results[rank] = payload
        return [results[r] for r in range(self.world)]

    def _pump_replies(self) -> None:
        """Publish every event the ranks send, in order, and queue their answers; ends once stopped
        and the queue is empty."""
        while True:
            try:
                kind, rank, payload = self._replies.get(timeout=POLL_S)
            except queue.Empty:
                if self._pump_stop.is_set():
                    return
                continue
            except (EOFError, OSError, ValueError):  # the queue was closed under us
                return
            if kind == "event":
                with contextlib.suppress(Exception):  # a failing observer must not stop the events
                    self._publish(rank, payload)
            else:
                self._answers.put((kind, rank, payload))

    def _end_pump(self) -> None:
        self._pump_stop.set()
        self._pump.join(timeout=5.0)

    def _publish(self, rank: int, event: Event) -> None:
        event = replace(event, rank=rank)
        if self.on_event is not None:
            self.on_event(rank, event)
        self.bus.publish(event)

    def _dead_rank(self, what: str, wait_s: float = 1.0) -> str | None:
        """The line for a rank whose process has exited, waiting `wait_s` for the exit to be seen."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, p in enumerate(self._procs):
                if p.exitcode is not None:
                    return f"rank {rank} exited (code {p.exitcode}) during {what}"
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def _check_alive(self, what: str) -> None:
        for rank, p in enumerate(self._procs):
            if p.exitcode is not None:
                self._stop(f"rank {rank} exited (code {p.exitcode}) during {what}")

    def _stop(self, reason: str, error: type[RankFailed] = RankFailed) -> None:
        self.closed = True
        self._kill()
        self._end_pump()
        raise error(reason)

    def _kill(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(STOP_GRACE_S)
            if p.is_alive():
                p.kill()
                p.join(1.0)
