"""The queue panel's rows, kept from the request service's events (no Textual).

The service owns the queue; the console only mirrors it for the panel: the running request first, then
the waiting ones in the order they will run, each with its prompt, size, state and the forecast the
engine computed for it (step time and peak, once it has answered). A request that ended leaves the rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from ..engine import events
from ..engine.api import plain, service
from ..offload.units import format_bytes, format_seconds
from .lora_set import lora_text


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One request in the queue panel."""

    ticket: int
    prompt: str
    size: str  # `64x64`, `64x64x9` for frames, `default` where the pipeline chooses
    state: str = "queued"  # queued or running
    step_s: float | None = None  # the engine's forecast per denoise step (None: not known yet)
    peak: int | None = None  # the engine's forecast device peak
    forecast_known: bool = False  # the engine has answered (its answer may still be "unknown")


def size_of(request: Any) -> str:
    if request.width is None or request.height is None:
        return "default"
    return f"{request.width}x{request.height}" + (f"x{request.frames}" if request.frames else "")


class QueueRows:
    """What the queue panel shows, in running-then-queue order."""

    def __init__(self) -> None:
        self.rows: dict[int, QueueRow] = {}
        self.order: list[int] = []  # waiting tickets, next first
        self.running: int | None = None

    def added(self, ticket: int, request: Any) -> None:
        """A request the console submitted (before its queued event: the row has its prompt and size)."""
        lora = plain(lora_text(getattr(request, "loras", None)))  # started with --lora: the set it carries
        self.rows.setdefault(ticket, QueueRow(ticket, plain(request.prompt),
                                              size_of(request) + (f" · {lora}" if lora else "")))

    def forecast(self, ticket: int, forecast: Any) -> None:
        """The engine's forecast for the request (a `RequestForecast`, or None: unknown)."""
        row = self.rows.get(ticket)
        if row is not None:
            self.rows[ticket] = replace(row, step_s=getattr(forecast, "step_s", None),
                                        peak=getattr(forecast, "peak_bytes", None), forecast_known=True)

    def apply(self, events: Iterable[events.Event]) -> bool:
        """Take the service's events; True when the rows changed."""
        changed = False
        for event in events:
            changed |= self._apply(event)
        return changed

    def _apply(self, event: events.Event) -> bool:
        ev = service.request_events
        if isinstance(event, ev.RequestQueued):
            self.rows.setdefault(event.ticket, QueueRow(event.ticket, plain(event.prompt), "?"))
            if event.ticket not in self.order and event.ticket != self.running:
                self.order.append(event.ticket)
            return True
        if isinstance(event, ev.QueueReordered):
            self.order = [t for t in event.tickets if t in self.rows]
            return True
        if isinstance(event, ev.RequestRunning):
            self.running = event.ticket
            self.order = [t for t in self.order if t != event.ticket]
            if event.ticket in self.rows:
                self.rows[event.ticket] = replace(self.rows[event.ticket], state="running")
            return True
        if isinstance(event, (ev.RequestDone, ev.RequestFailed, ev.RequestCancelled)):
            self.rows.pop(event.ticket, None)
            self.order = [t for t in self.order if t != event.ticket]
            if self.running == event.ticket:
                self.running = None
            return True
        return False

    def shown(self) -> list[QueueRow]:
        """The running request, then the waiting ones, next first."""
        tickets = ([self.running] if self.running is not None else []) + self.order
        return [self.rows[t] for t in tickets if t in self.rows]

    def waiting(self) -> list[int]:
        return list(self.order)


def row_cells(position: int, row: QueueRow) -> tuple[str, str, str, str, str, str]:
    """(position, state, prompt, size, step, peak) as the panel shows them; position 0 is the running one."""
    if not row.forecast_known:
        step = peak = "…"
    else:
        step = format_seconds(row.step_s) if row.step_s is not None else "unknown"
        peak = format_bytes(row.peak) if row.peak is not None else "unknown"
    where = "▶" if row.state == "running" else str(position)
    return where, row.state, row.prompt, row.size, step, peak
