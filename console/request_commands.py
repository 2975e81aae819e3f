"""Requests: the live screen's `g`, the generate dialog's request through the engine's request service, and
its outcome.

Part of `OmniConsoleApp` (a mixin over the `ConsoleHost` protocol: the session's phase, the live
screen, the service). `g` while a request runs adds to the service's queue (the queue panel shows it). The
image or video is written by the service on the engine thread as soon as the request returns, its report
kept in the history (`request_report`); the outcome (toast, request line, event-log line) is worded by
`request_outcome`.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ..engine import events
from ..engine.api import GenerateRequest, checks, models, service
from ..engine.errors import OPERATOR_ERRORS
from . import request_outcome
from .command_done import CommandDone
from .engine_answers import PENDING
from .event_text import one_line
from .generate_form import RequestForm, expected_frames
from .outputs import AUDIO_SUFFIX, MAX_SUFFIX, VIDEO_SUFFIX, output_stem, save_result
from .plan_commands import request_forecast_of
from .request_defaults import FORECASTING_LINE, default_request, forecast_line, small_request
from .screens import GenerateDialog

if TYPE_CHECKING:
    from .host import ConsoleHost


def failure_line(exc: BaseException) -> str:
    return one_line(f"{type(exc).__name__}: {exc}")


def free_output(out_dir: Path, pipeline_class: str, number: int) -> Path:
    """A name for request `number`'s output that no file has now (`YYYYmmdd-HHMMSS-request-N.png`, `-2`, …;
    `.mp4` for a video pipeline, `.wav` for one that makes audio only). The write itself is exclusive: a file
    that appears meanwhile is never replaced (the request then fails its write in one line)."""
    if models.makes_still_images(pipeline_class) is False:
        extension = VIDEO_SUFFIX
    else:
        extension = AUDIO_SUFFIX if models.makes_audio_only(pipeline_class) else ".png"
    stem = output_stem(number)
    for suffix in range(1, MAX_SUFFIX + 1):
        path = out_dir / (f"{stem}{extension}" if suffix == 1 else f"{stem}-{suffix}{extension}")
        if not os.path.lexists(path):
            return path.resolve()
    raise FileExistsError(f"no free name for {stem}{extension} in {out_dir} after {MAX_SUFFIX} tries")


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
        defaults = replace(defaults, cache=session.cache)  # `s` (or the last dialog) chose it for the next request
        form = RequestForm.for_model(self.model, defaults, make_request, self.cache_kinds())
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
        """Submit one request to the engine's request service (it queues behind a running one).

        Checked here against the model and its output name (one line refused, nothing queued); the
        returned future ends with the engine's result (or its exception; cancelled: removed from the queue
        before it ran) once the output is written on the engine thread (`_write_then_finish`)."""
        session = self.session
        if request is None or session.phase != "live":
            return None
        if request.loras is None and self.lora_set:  # the LoRA panel's set now: kept while it waits
            request = replace(request, loras=self.lora_set.request_loras())
        queue = self.service
        idle = queue.running is None and not queue.waiting()
        try:
            run = queue.check(request, free_output(self.out_dir, self.model.pipeline_class, self.submitted + 1))
        except (*OPERATOR_ERRORS, OSError) as exc:
            self.say(f"request refused: {exc}", "error", timeout=10)
            return None
        self.submitted += 1
        session.request_started(request, str(self.model.path), checks.request_size(request))
        if idle:  # the live line says what runs; a queued request's line comes with its RequestRunning event
            self.router.request_id = None
            if self.live_screen is not None:
                self.live_screen.set_generation(f"request: {request.prompt!r} · queued", 0, request.steps or 1)
                self.live_screen.show_request_frames(expected_frames(self.model, request))
        ticket = queue.submit(run)
        self.queue_rows.added(ticket.number, request)
        self.ask_queue_forecast(ticket)
        done: Future = Future()
        session.track("generate", done)
        ticket.future.add_done_callback(lambda _f: self._write_then_finish(ticket, done))
        return done

    def _write_then_finish(self: ConsoleHost, ticket: service.Ticket, done: Future) -> None:
        """Runs on the engine thread (the service hands a `generated` request back to its face): write the
        output through the service (atomic, never over a file), keep the report in the history, let the next
        request run, then tell the UI thread.

        A request cancelled before its last step is not saved unless `save_partial`; data-parallel ranks'
        images (their own seeds) are saved beside it under new names."""
        outcome = ticket.future.result()
        output: Path | None = None
        save_error: str | None = None
        if outcome.state == "generated":
            result = outcome.result
            if request_outcome.should_save(result, self.save_partial):
                try:
                    outcome = self.service.write(ticket, outcome)
                except Exception as exc:  # noqa: BLE001 - a write must not take the console down
                    outcome = replace(outcome, state="failed", stage="write", error=failure_line(exc))
                if outcome.state == "failed":
                    save_error = outcome.error
                elif outcome.written is not None and outcome.written.files:
                    output = outcome.written.files[0]
                    self._save_rank_results(result)
            else:
                partial = request_outcome.is_partial(result)
                outcome = replace(outcome, state="cancelled" if partial else "done", written=service.Written())
            report = None
            if outcome.state == "done":
                try:
                    report = self.reporter.build(ticket, outcome)
                except Exception as exc:  # noqa: BLE001 - a report that cannot be built costs the history its report
                    self.engine.bus.publish(events.LogEvent(level="warning", message=f"report: {failure_line(exc)}"))
            self.service.finish(ticket, outcome, report)
        if outcome.result is not None:
            done.set_result(outcome.result)
        elif outcome.exception is not None:
            done.set_exception(outcome.exception)
        elif outcome.state == "cancelled":
            done.cancel()  # removed from the queue before it ran
        else:
            done.set_exception(RuntimeError(outcome.error or "the request did not run"))
        self._post_from_worker(CommandDone("generate", done, output, save_error))

    def _save_rank_results(self: ConsoleHost, result: service.GenerateResult) -> None:
        """A data-parallel group's other ranks' images, under new names beside the request's."""
        for rank, other in enumerate(result.rank_results, start=1):
            try:
                path = save_result(other, self.out_dir, result.request_id)
            except Exception as exc:  # noqa: BLE001 - a full disk must not take the console down
                self.engine.bus.publish(events.LogEvent(level="warning", message=f"rank {rank}: not saved: {exc}"))
                continue
            self.engine.bus.publish(events.LogEvent(level="info", message=f"rank {rank}: saved {path}"))

    def _generate_done(self: ConsoleHost, message: CommandDone) -> None:
        session = self.session
        future = message.future
        if future.cancelled():  # removed from the queue before it ran: the running request goes on
            session.generating = self.service.running is not None or bool(self.service.waiting())
            self.say("a queued request was cancelled before it ran", "warning", timeout=5)
            return
        if self.live_screen is not None:
            self.live_screen.cancelling = False
        exc = future.exception()
        if exc is not None:
            error = f"{type(exc).__name__}: {exc}"
            session.request_ended(error, queued=self.service.running is not None or bool(self.service.waiting()))
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
        session.request_ended(output=message.output,
                              queued=self.service.running is not None or bool(self.service.waiting()))
        if self.live_screen is not None and message.output is not None:
            self.live_screen.show_output_preview(message.output)
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

