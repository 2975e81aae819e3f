"""The request service's events: every change of a queued request's state, on the engine's bus.

A request's own progress (steps, phases, telemetry) is the engine's events, passed through on the same
bus; these say what happened to the request as a whole. `ticket` is the service's number for it (the
engine's `request_id` numbers runs, and a cancelled request never runs).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..events import Event


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestQueued(Event):
    ticket: int
    position: int  # 0: next to run
    prompt: str


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueReordered(Event):
    tickets: tuple[int, ...]  # the queue as it now is, next to run first


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRunning(Event):
    ticket: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestDone(Event):
    ticket: int
    files: tuple[str, ...]
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFailed(Event):
    ticket: int
    error: str  # one line


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestCancelled(Event):
    ticket: int
    running: bool  # True: stopped at its next safe point; False: removed from the queue before it ran


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryNote(Event):
    """The history file could not be used (ignored; the history starts empty): the one note why."""

    message: str


SERVICE_EVENTS = (RequestQueued, QueueReordered, RequestRunning, RequestDone, RequestFailed, RequestCancelled,
                  HistoryNote)
