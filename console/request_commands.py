"""Requests: the live screen's `g`, the generate dialog's request on the worker, and its outcome.

Part of `OmniConsoleApp` (a mixin over the `ConsoleHost` protocol: the session's phase, the live
screen, the worker). The image or
video is saved on the engine thread as soon as the request returns; the outcome (toast, request
line, event-log line) is worded by `request_outcome`.
"""

from __future__ import annotations

from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ..engine import events
from ..engine.api import GenerateRequest, checks, service
from . import request_outcome
from .command_done import CommandDone
from .engine_answers import PENDING
from .generate_form import RequestForm, expected_frames
from .outputs import save_result
from .plan_commands import request_forecast_of
from .request_defaults import FORECASTING_LINE, default_request, forecast_line, small_request
from .screens import GenerateDialog

if TYPE_CHECKING:
    from .host import ConsoleHost


class RequestCommands:
    """g for the app, the request it runs, and its outcome."""

    def action_generate(self: ConsoleHost) -> None:
        """g: the generate dialog, prefilled with the model's working defaults."""
        session = self.session
        refusal = session.refuse_generate()
        if refusal is not None:
            self.say(*refusal)
            return
        make_request = partial(default_request, self)
        remembered = session.last_requests.get(str(self.model.path))
        if remembered is not None:  # the last request's values for this model, as the operator left them
            defaults = remembered
        elif self.engine_device.split(":")[0] == "cpu":
            defaults = small_request(self, session.prompt, session.planned)
        else:
            defaults = make_request(prompt=session.prompt)
        form = RequestForm.for_model(self.model, defaults, make_request)
        self.dialog_forecasts = self.engine_answers("dialog")  # this dialog's: nothing runs while it is open
        self.push_screen(GenerateDialog(form, self.request_forecast_line), self.start_generate)

    def request_forecast_line(self: ConsoleHost, request: GenerateRequest) -> str:
        """The generate dialog's forecast of `request` (cached or scaled profile), before Enter; computed on
        the engine thread (it reads the streamer's observed bandwidth and the profile cache), so the line
        says it is coming until the answer redraws the dialog (`on_engine_answered`)."""
        steps = request.steps
        planned = self.session.planned  # the loaded pipeline's default step count, from the engine's PlanReady
        if steps is None and planned is not None:
            steps = planned.steps or None
        size = checks.request_size(request)
        forecast = self.dialog_forecasts.get(size, request_forecast_of(size, None, self.session.bandwidth))
        return FORECASTING_LINE if forecast is PENDING else forecast_line(forecast, steps)

    def start_generate(self: ConsoleHost, request: GenerateRequest | None) -> Future | None:
        """Run one request on the worker; the image is saved on the worker thread when it is done."""
        session = self.session
        if request is None or session.phase != "live" or session.generating:
            return None
        session.request_started(request, str(self.model.path), checks.request_size(request))
        self.router.request_id = None
        if self.live_screen is not None:
            self.live_screen.set_generation(f"request: {request.prompt!r} · queued", 0, request.steps or 1)
            self.live_screen.show_request_frames(expected_frames(self.model, request))
        future = session.track("generate", self.worker.generate(request))
        future.add_done_callback(self._save_then_report)
        return future

    def _save_then_report(self: ConsoleHost, future: Future) -> None:
        """Runs on the engine thread (or here if already done): save the image, then report.

        Every image or video goes to a new file (`outputs.save_result`: timestamped, created exclusively);
        a request cancelled before its last step is not saved unless `save_partial`.
        """
        output: Path | None = None
        save_error: str | None = None
        if not future.cancelled() and future.exception() is None:
            result = future.result()
            if request_outcome.should_save(result, self.save_partial):
                try:
                    output = save_result(result, self.out_dir, result.request_id)
                    for rank, other in enumerate(result.rank_results, start=1):  # data-parallel ranks' seeds
                        path = save_result(other, self.out_dir, result.request_id)
                        self.engine.bus.publish(events.LogEvent(level="info", message=f"rank {rank}: saved {path}"))
                except Exception as exc:  # a full disk must not take the console down
                    output, save_error = output, f"{type(exc).__name__}: {exc}"
        self._post_from_worker(CommandDone("generate", future, output, save_error))

    def _generate_done(self: ConsoleHost, message: CommandDone) -> None:
        session = self.session
        if self.live_screen is not None:
            self.live_screen.cancelling = False
        future = message.future
        exc = None if future.cancelled() else future.exception()
        if future.cancelled() or exc is not None:
            error = "cancelled before it started" if exc is None else f"{type(exc).__name__}: {exc}"
            session.request_ended(error)
            if self.live_screen is not None:
                self.live_screen.show_request_frames(None)  # no phases follow a failed request
            if isinstance(exc, service.RequestCancelled):
                self._show_outcome(request_outcome.cancelled(self.router.request_id, exc.steps_done, exc.total_steps))
            else:
                self._show_outcome(request_outcome.failed(self.router.request_id, error))
            if session.engine_state == service.EngineState.FAILED:  # a rank group stopped: nothing is loaded any more
                self.back_to_plan(f"{session.failure}; every rank's memory released — press l to load again",
                                  "error")
            return
        result = future.result()
        session.request_ended(output=message.output)
        done, total = request_outcome.steps_done(result)
        self._show_outcome(request_outcome.finished(result, message.output, message.save_error), done, total)

    def _show_outcome(self: ConsoleHost, outcome: request_outcome.Outcome, done: int | None = None,
                      total: int | None = None) -> None:
        """Toast, request line and (for failures, cancellations, save errors) a line in the event log."""
        live = self.live_screen
        if live is not None:
            if outcome.log is not None:
                live.add_log([outcome.log])
            live.set_generation(outcome.status, done, None if total is None else max(total, 1))
        self.say(outcome.notice, outcome.severity, timeout=10)

