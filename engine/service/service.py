"""`RequestService`: one owner of the request lifecycle, shared by the TUI and `run`.

`submit` checks a request against the model before any work (ConfigError, one line) and queues it;
requests run one at a time, in queue order, as commands on the engine's worker (`EngineWorker`), so they
queue behind a load or re-plan too. A finished request's outputs are written atomically on the worker,
or by the caller (`write_in_caller`: `run` writes on its main thread, where a signal unwinds the write);
every outcome is kept in the history (when the service has one) and every state change is an event on
the engine's bus, beside the engine's own progress events.
"""

from __future__ import annotations

import itertools
import json
import statistics
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from ..errors import OPERATOR_ERRORS
from ..handle import EngineHandle
from ..running.cache_spec import parse_cache
from ..running.runner import GenerateRequest
from ..running.runner import RequestCancelled as StoppedBetweenBlocks
from ..worker import EngineWorker
from .checks import CALL_NAMES, CheckedRun, Names, check_run
from .events import (
    HistoryNote,
    QueueReordered,
    RequestCancelled,
    RequestDone,
    RequestFailed,
    RequestQueued,
    RequestRunning,
)
from .history import History, HistoryEntry, HistoryRequest, bounded_report
from .outputs import Written, write_outputs
from .queue import RequestQueue

State = Literal["queued", "running", "generated", "done", "failed", "cancelled"]


def failure_line(exc: BaseException) -> str:
    """An exception as the one line an operator reads: an operator error's own words, else its type too."""
    text = str(exc) if isinstance(exc, OPERATOR_ERRORS) else f"{type(exc).__name__}: {exc}"
    lines = text.strip().splitlines()
    return lines[0] if lines else type(exc).__name__


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended. `generated`: run, its outputs not written yet (`write_in_caller`)."""

    state: State
    result: Any = None  # the engine's GenerateResult (None: it never ran, or the run raised)
    written: Written | None = None
    error: str = ""  # one line, for `failed`
    stage: str = "generation"  # where it failed: generation or write
    exception: BaseException | None = None  # what the run raised (a face may word some in its own way)


@dataclass(eq=False)
class Ticket:
    """One submitted request: its number, what was checked, its state, and the future of its outcome."""

    number: int
    run: CheckedRun
    state: State = "queued"
    forecast: Any = None  # what a face attached for its queue view (the service does not read it)
    future: Future[Outcome] = field(default_factory=Future)

    @property
    def request(self) -> GenerateRequest:
        return self.run.request

    @property
    def fps(self) -> float | None:
        return self.run.fps


class RequestService:
    """The queue, the one-at-a-time runner, the writer and the history of one engine's requests."""

    def __init__(self, engine: EngineHandle, *, worker: EngineWorker | None = None, history: History | None = None,
                 names: Names = CALL_NAMES, write_in_caller: bool = False,
                 report: Callable[[Ticket, Outcome], dict[str, Any] | None] | None = None) -> None:
        """`worker`: the engine's worker (default: one of the service's own, shut down by `close`).
        `report`: the run report kept in the history for a finished request."""
        self.engine = engine
        self.bus = engine.bus
        self.worker = worker or EngineWorker(engine)
        self._own_worker = worker is None
        self.history = history
        self.names = names
        self.write_in_caller = write_in_caller
        self.report = report
        self.queue: RequestQueue[Ticket] = RequestQueue(lambda t: t.number)
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._running: Ticket | None = None
        self._closed = False
        if history is not None and history.note:
            self.bus.publish(HistoryNote(message=history.note))

    # ---------------------------------------------------------------- the faces' calls

    def check(self, request: GenerateRequest, output: Path, *, overwrite: bool = False,
              fps: float | None = None) -> CheckedRun:
        """The request and its output against the model, before any work (ConfigError, one line)."""
        return check_run(self.engine.model, request, output, overwrite=overwrite, fps=fps, names=self.names)

    def submit(self, request: GenerateRequest | CheckedRun, output: Path | None = None, *, overwrite: bool = False,
               fps: float | None = None) -> Ticket:
        """Check (unless given a `CheckedRun`) and queue a request; it runs when those before it have."""
        if isinstance(request, CheckedRun):
            run = request
        else:
            if output is None:
                raise ValueError("submit: an output path is needed with a request")
            run = self.check(request, output, overwrite=overwrite, fps=fps)
        ticket = Ticket(next(self._numbers), run)
        with self._lock:
            if self._closed:
                raise RuntimeError("the request service is closed")
            position = self.queue.push(ticket) + (self._running is not None)
        self.bus.publish(RequestQueued(ticket=ticket.number, position=position, prompt=run.request.prompt))
        self._dispatch()
        return ticket

    def wait(self, ticket: Ticket, cancel: threading.Event | None = None, poll_s: float = 0.05) -> Outcome:
        """Block until `ticket` ends (or is `generated`); `cancel` set meanwhile cancels it (a CLI's Ctrl+C)."""
        while True:
            try:
                return ticket.future.result(timeout=poll_s)
            except TimeoutError:
                if cancel is not None and cancel.is_set():
                    self.cancel(ticket.number)

    def cancel(self, number: int) -> bool:
        """Cancel a waiting request (removed at once) or the running one (stops at its next safe point)."""
        waiting = self.queue.remove(number)
        if waiting is not None:
            self._end(waiting, Outcome("cancelled"), running=False)
            return True
        with self._lock:
            running = self._running
        if running is not None and running.number == number and running.state == "running":
            self.worker.cancel()
            return True
        return False

    def clear(self) -> int:
        """Cancel every waiting request (the running one goes on); how many."""
        waiting = self.queue.clear()
        for ticket in waiting:
            self._end(ticket, Outcome("cancelled"), running=False)
        return len(waiting)

    def move(self, number: int, position: int) -> bool:
        """Put a waiting request at `position` (0: next); False when it is not waiting."""
        moved = self.queue.move(number, position)
        if moved:
            self.bus.publish(QueueReordered(tickets=self.queue.tickets()))
        return moved

    def waiting(self) -> list[Ticket]:
        """The queue, next first (the running request is not in it)."""
        return self.queue.items()

    @property
    def running(self) -> Ticket | None:
        with self._lock:
            return self._running

    def write(self, ticket: Ticket, outcome: Outcome, before: Callable[[], None] | None = None) -> Outcome:
        """`write_in_caller`: write a `generated` outcome's files on this thread; the outcome with them.
        `finish` then records it and lets the next request run."""
        if outcome.state != "generated":
            return outcome
        try:
            written = write_outputs(outcome.result, ticket.run, ticket.fps, before=before)
        except OSError as exc:
            return replace(outcome, state="failed", stage="write",
                           error=f"cannot write {exc.filename or ticket.run.output.path}: {exc.strerror or exc}")
        except ValueError as exc:  # frames the writers cannot take (mixed sizes, not RGB)
            lines = str(exc).strip().splitlines()
            return replace(outcome, state="failed", stage="write",
                           error=f"cannot write {ticket.run.output.path}: {lines[0] if lines else type(exc).__name__}")
        return replace(outcome, state="done", written=written)

    def finish(self, ticket: Ticket, outcome: Outcome, report: dict[str, Any] | None = None) -> None:
        """`write_in_caller`: the request is over (written, or failed): record it, run the next."""
        self._end(ticket, outcome, running=True, report=report)
        self._dispatch()

    def close(self) -> None:
        """Cancel what waits and what runs; end the worker if it is the service's own (the engine stays
        open: it is its owner's to close)."""
        with self._lock:
            self._closed = True
            running = self._running
        self.clear()
        if running is not None:
            self.worker.cancel()
        if self._own_worker:
            self.worker.request_shutdown(release=False)

    # ---------------------------------------------------------------- on the worker

    def _dispatch(self) -> None:
        with self._lock:
            if self._running is not None or self._closed:
                return
            ticket = self.queue.pop()
            if ticket is None:
                return
            self._running = ticket
            ticket.state = "running"
        try:
            future = self.worker.command(lambda cancel: self._execute(ticket, cancel))
        except RuntimeError as exc:  # the worker was shut down under us
            self._end(ticket, Outcome("failed", error=failure_line(exc)), running=True)
            return
        future.add_done_callback(lambda done: self._ran(ticket, done))

    def _execute(self, ticket: Ticket, cancel: threading.Event) -> Outcome:
        self.bus.publish(RequestRunning(ticket=ticket.number))
        result = self.engine.generate(ticket.request, cancel)
        if result.cancelled or cancel.is_set():
            return Outcome("cancelled", result)
        outcome = Outcome("generated", result)
        return outcome if self.write_in_caller else self.write(ticket, outcome)

    def _ran(self, ticket: Ticket, done: Future[Outcome]) -> None:
        if done.cancelled():
            outcome = Outcome("cancelled")
        elif isinstance(exc := done.exception(), StoppedBetweenBlocks):  # stopped between two blocks: a cancel
            outcome = Outcome("cancelled", exception=exc)
        elif exc is not None:
            outcome = Outcome("failed", error=failure_line(exc), exception=exc)
        else:
            outcome = done.result()
        if outcome.state == "generated":  # the caller writes, then calls `finish`
            ticket.state = "generated"
            ticket.future.set_result(outcome)
            return
        report = self.report(ticket, outcome) if self.report is not None and outcome.result is not None else None
        self._end(ticket, outcome, running=True, report=report)
        self._dispatch()

    # ---------------------------------------------------------------- the end of a request

    def _end(self, ticket: Ticket, outcome: Outcome, *, running: bool, report: dict[str, Any] | None = None) -> None:
        ticket.state = outcome.state
        with self._lock:
            if self._running is ticket:
                self._running = None
        if outcome.state == "done":
            files = tuple(str(f) for f in (outcome.written.files if outcome.written else ()))
            self.bus.publish(RequestDone(ticket=ticket.number, files=files, seconds=outcome.result.seconds))
        elif outcome.state == "failed":
            self.bus.publish(RequestFailed(ticket=ticket.number, error=f"{outcome.stage} failed: {outcome.error}"))
        else:
            self.bus.publish(RequestCancelled(ticket=ticket.number, running=running))
        if self.history is not None and (running or outcome.state != "cancelled"):
            self._remember(ticket, outcome, report)
        if not ticket.future.done():
            ticket.future.set_result(outcome)

    def _remember(self, ticket: Ticket, outcome: Outcome, report: dict[str, Any] | None) -> None:
        assert self.history is not None
        try:
            self.history.add(history_entry(self.engine, ticket, outcome, report))
        except (OSError, ValueError) as exc:  # an unwritable cache or a value JSON cannot hold: kept out
            from ..events import LogEvent

            self.bus.publish(LogEvent(level="warning", message=f"history not saved: {failure_line(exc)}"))


def history_entry(engine: EngineHandle, ticket: Ticket, outcome: Outcome, report: dict[str, Any] | None
                  ) -> HistoryEntry:
    """What the history keeps of a request that ran (or was cancelled while it ran)."""
    r, result = ticket.request, outcome.result
    steps = list(getattr(result, "steps", ()) or ())
    plan = engine.plan
    return HistoryEntry(
        ticket=ticket.number, finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
        model=str(engine.model.path),
        request=HistoryRequest(prompt=r.prompt, steps=r.steps, height=r.height, width=r.width, seed=r.seed,
                               guidance=r.guidance, frames=r.frames, negative_prompt=r.negative_prompt,
                               max_sequence_length=r.max_sequence_length,
                               image=str(r.image) if r.image is not None else None,
                               params=json.loads(json.dumps(r.params, default=str)),
                               output=str(ticket.run.output.path), overwrite=ticket.run.output.overwrite,
                               fps=ticket.fps, cache=r.cache.text() if r.cache is not None else None,
                               loras=[(str(f), float(s)) for f, s in r.loras] if r.loras is not None else None),
        policy=json.loads(plan.policy.model_dump_json()) if plan is not None else {},
        status="failed" if outcome.state == "failed" else outcome.state,  # type: ignore[arg-type]
        error=(f"{outcome.stage} failed: {outcome.error}" if outcome.error else "")[:4096],
        seconds=getattr(result, "seconds", None),
        step_s=statistics.median(s.wall_s for s in steps) if steps else None,
        peak_bytes=getattr(result, "peak_allocated_bytes", None),
        files=[str(f) for f in outcome.written.files] if outcome.written else [],
        report=bounded_report(report))


def request_of(entry: HistoryEntry) -> GenerateRequest:
    """A history entry's request, to submit again with its settings."""
    q = entry.request
    return GenerateRequest(prompt=q.prompt, steps=q.steps, height=q.height, width=q.width, seed=q.seed,
                           guidance=q.guidance, frames=q.frames, negative_prompt=q.negative_prompt,
                           max_sequence_length=q.max_sequence_length,
                           image=Path(q.image) if q.image is not None else None, params=dict(q.params),
                           cache=parse_cache(q.cache))
