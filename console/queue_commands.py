"""The queue and the history for the app: the service's events shown, the queue panel's keys, re-runs.

Part of `OmniConsoleApp` (a mixin over the `ConsoleHost` protocol). The engine's `RequestService` owns
the queue; its events come through the one event stream (the app's bus subscription) and keep the
queue panel's rows (`request_queue.QueueRows`). Cancel, move and clear go to the service at once (they
only touch its queue, never the engine); the running request is cancelled at its next safe point.
Each queued request's forecast is the engine's (computed on the engine thread, shown when it answers).
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from textual.message import Message

from ..engine import events
from ..engine.api import checks, plain, service
from .engine_answers import PENDING
from .generate_form import expected_frames
from .plan_commands import request_forecast_of
from .screens import HistoryScreen

if TYPE_CHECKING:
    from .host import ConsoleHost

SERVICE_EVENTS = service.request_events.SERVICE_EVENTS


class QueueForecast(Message):
    """The engine thread's forecast for a queued request (posted from it; shown on the UI thread)."""

    def __init__(self, ticket: int, future: Future) -> None:
        super().__init__()
        self.ticket = ticket
        self.future = future


class QueueCommands:
    """The queue panel's actions, the service's events and the history's re-run."""

    def ask_queue_forecast(self: ConsoleHost, ticket: service.Ticket) -> None:
        """The request's forecast: the generate dialog's answer when it has one for this size, else asked of
        the engine thread (it answers between requests: a request in flight holds that thread)."""
        size = checks.request_size(ticket.request)
        compute = request_forecast_of(size, None, self.session.bandwidth)
        known = self.dialog_forecasts.get(size, compute)
        if known is not PENDING:
            ticket.forecast = known
            self.queue_rows.forecast(ticket.number, known)
            return
        try:
            future = self.worker.call(compute)
        except RuntimeError:  # the worker is shut down: the app is quitting
            return
        future.add_done_callback(lambda f: self._post_from_worker(QueueForecast(ticket.number, f)))

    def on_queue_forecast(self: ConsoleHost, message: QueueForecast) -> None:
        future = message.future
        forecast = None if future.cancelled() or future.exception() is not None else future.result()
        self.queue_rows.forecast(message.ticket, forecast)
        self.show_queue()

    def follow_requests(self: ConsoleHost, events: Iterable[events.Event]) -> None:
        """The service's events among a drained batch: the queue panel's rows, the history's note, the live
        line of a queued request that starts."""
        mine = [e for e in events if isinstance(e, SERVICE_EVENTS)]
        if not mine:
            return
        for event in mine:
            if isinstance(event, service.request_events.HistoryNote):
                self.say(f"note: {event.message}", "warning", timeout=10)
            elif isinstance(event, service.request_events.RequestRunning):
                self._queued_request_started(event.ticket)
        if self.queue_rows.apply(mine):
            self.show_queue()

    def _queued_request_started(self: ConsoleHost, number: int) -> None:
        """A request starts on the engine thread: the live line is its own from now (its steps follow)."""
        self.router.request_id = None  # the engine's number for it comes with its RequestStarted
        ticket, live = self.service.running, self.live_screen
        if live is None or ticket is None or ticket.number != number:
            return
        if self.cancelled_request != number:  # esc may come before this event is drained: it still holds
            live.cancelling = False
        live.set_generation(f"request: {ticket.request.prompt!r} · running", 0, ticket.request.steps or 1)
        live.show_request_frames(expected_frames(self.model, ticket.request))

    def show_queue(self: ConsoleHost) -> None:
        if self.live_screen is not None:
            self.live_screen.show_queue(self.queue_rows.shown())

    # ---- the queue panel's keys (the panel names the request; the service acts on its queue)

    def queue_cancel(self: ConsoleHost, number: int) -> None:
        running = self.service.running
        is_running = running is not None and running.number == number
        if self.service.cancel(number):
            if is_running and self.live_screen is not None:
                self.cancelled_request = number
                self.live_screen.cancelling = True  # as esc: said until the request ends
            self.say(f"cancelling request {number}…" if is_running else f"request {number} removed from the queue",
                     "warning", timeout=4)

    def queue_move(self: ConsoleHost, number: int, delta: int) -> None:
        waiting = [t.number for t in self.service.waiting()]
        if number in waiting:
            self.service.move(number, max(0, waiting.index(number) + delta))

    def queue_clear(self: ConsoleHost) -> None:
        cleared = self.service.clear()
        self.say(f"{cleared} queued request{'s' if cleared != 1 else ''} cancelled" if cleared
                 else "nothing is waiting in the queue", "warning" if cleared else "information", timeout=4)

    # ---- the history

    def action_history(self: ConsoleHost) -> None:
        """The request history (newest first; the service's, read from the cache when the console opened and
        kept since). `enter` on a row submits that request again with its settings."""
        if not isinstance(self.screen, HistoryScreen):
            history = self.service.history
            entries = history.entries if history is not None else []
            note = history.note if history is not None else None
            self.push_screen(HistoryScreen(entries, note, out_dir=self.out_dir), self.rerun)

    def rerun(self: ConsoleHost, entry: service.HistoryEntry | None) -> Any:
        """A history row's request, submitted again (its prompt, size, steps, seed, …; a new output name)."""
        if entry is None:
            return None
        refusal = self.session.refuse_generate()
        if refusal is not None:
            self.say(*refusal)
            return None
        future = self.start_generate(service.request_of(entry))
        if future is not None:
            self.say(f"queued again: {plain(entry.request.prompt)[:60]}", timeout=4)
        return future
