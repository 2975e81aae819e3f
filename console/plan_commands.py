"""The plan screen's side of the app: policy edits, the forecasts (asked of the engine thread), the forecast's
device link and the header.

Part of `OmniConsoleApp` (a mixin over the `ConsoleHost` protocol: the session's phase and editor, the
telemetry). Edits arrive as
the `app.edit(...)` action (d, +, -, m) or the screen's `EditSelected` message (space/enter, x on a
row); each is kept only when the engine can plan it, then every view is redrawn for the new plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.api import RequestForecast, planner
from ..engine.errors import ConfigError
from ..offload.units import format_bytes
from .command_done import CommandDone, EngineAnswered
from .engine_answers import PENDING, EngineAnswers
from .plan_context import LinkInfo, header_text, link_info
from .screens import GenerateDialog, PlanScreen
from .screens.budget import BudgetDialog
from .session import READ_ONLY

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..engine.api import EngineHandle, Plan, RequestSize, planner
    from .host import ConsoleHost


def request_forecast_of(size: RequestSize, plan: Plan | None, bandwidth: float | None
                        ) -> Callable[[EngineHandle], RequestForecast | None]:
    """The request forecast as the engine thread computes it, for the plan screen and the generate dialog
    alike (`plan` None: the loaded one): `Engine.forecast`, the same `forecast_for` that `plan` prints,
    with the same inputs, so the console and `plan` give one figure for one request."""
    return lambda engine: engine.forecast(size, plan=plan, probe_bandwidth=bandwidth)


def ram_plan_of(plan: Plan, size: RequestSize, bandwidth: float | None, budget: int
                ) -> Callable[[EngineHandle], tuple[Plan, planner.RamPlan] | ConfigError]:
    """`--ram-budget`'s tiers for `plan` as the engine thread plans them (`plan_for`, as `plan` does, for the
    load this engine makes: with live re-plan masters in the console); a budget nothing fits is the answer."""
    def compute(engine: EngineHandle) -> tuple[Plan, planner.RamPlan] | ConfigError:
        try:
            planned = planner.plan_for(engine, plan, None, size, bandwidth=bandwidth, forecast=False, ram_budget=budget,
                               live=engine.live_replan)
        except ConfigError as exc:  # NothingFitsHost: the smallest possible host peak, in one line
            return exc
        assert planned.ram is not None
        return planned.plan, planned.ram

    return compute


def load_tiers_of(plan: Plan, size: RequestSize, bandwidth: float | None, budget: int
                  ) -> Callable[[EngineHandle], planner.HostTiers]:
    """The host tiers a load under `--ram-budget` carries out, planned on the engine thread as the plan screen
    shows them (a budget nothing fits raises its one line: the load fails before anything is read)."""
    plan_ram = ram_plan_of(plan, size, bandwidth, budget)

    def tiers(engine: EngineHandle) -> planner.HostTiers:
        answer = plan_ram(engine)
        if isinstance(answer, Exception):
            raise answer
        return answer[0].tiers

    return tiers


class PlanCommands:
    """The policy edits and the plan screen's views."""

    def action_edit(self: ConsoleHost, what: str, value: object = None) -> bool:
        """d, +, -, m (and the selection's space/enter, x): one policy edit, kept only when it plans.

        With a model loaded the edit is applied live: the engine re-plans between requests (a request
        in flight finishes first), moving only what changes from its pinned masters."""
        session = self.session
        if session.phase == "live":
            return self._live_edit(what, value)
        if session.phase != "plan":
            self.say(READ_ONLY, "warning")
            return False
        applied = session.editor.edit(what, value)
        if applied.kept:
            self.refresh_plan_views()
        self.say(applied.message, applied.severity, timeout=2 if applied.kept else None)
        return applied.kept

    def action_budget(self: ConsoleHost) -> None:
        """b: ask for a VRAM budget, then let the planner choose the policy (off the UI thread); with a
        model loaded, the chosen policy is applied by a live re-plan."""
        refusal = self.session.refuse_budget()
        if refusal is not None:
            self.say(*refusal)
            return
        self.push_screen(BudgetDialog(self.session.last_budget, device=self.engine_device), self._plan_for_budget)

    def _plan_for_budget(self: ConsoleHost, entered: tuple[int, str] | None) -> None:
        if entered is None:
            return
        budget, self.session.last_budget = entered
        session = self.session
        plan, size, bandwidth = session.plan, session.request_size, session.bandwidth
        future = self.worker.call(lambda engine: planner.plan_for(engine, plan, budget, size, bandwidth=bandwidth,
                                                          forecast=False))
        self.say(f"planning for {format_bytes(budget)}…", timeout=2)
        future.add_done_callback(lambda f: self._post_from_worker(CommandDone("budget", f)))

    def _budget_done(self: ConsoleHost, message: CommandDone) -> None:
        exc = message.future.exception()
        if exc is not None:
            self.say(str(exc), "error")
            return
        planned = message.future.result()
        if self.action_edit("policy", planned.plan.policy):
            self.say("\n".join([f"VRAM budget {format_bytes(planned.auto.budget)}:", *planned.reasons]), timeout=12)

    def _live_edit(self: ConsoleHost, what: str, value: object) -> bool:
        if what == "mode":
            self.say("switching dlo ⇄ resident is a new load: u unloads, then m and l", "warning")
            return False
        applied = self.session.editor.edit(what, value)
        if not applied.kept:
            self.say(applied.message, applied.severity)
            return False
        policy = self.session.policy
        future = self.worker.call(lambda engine: engine.replan(policy))
        future.add_done_callback(lambda f: self._post_from_worker(CommandDone("replan", f)))
        queued = " (queued: the request in flight finishes first)" if self.session.generating else ""
        self.say(f"{applied.message} · re-planning{queued}…", timeout=3)
        return True  # the plan screen is redrawn when it is shown again (after u)

    def _replan_done(self: ConsoleHost, message: CommandDone) -> None:
        exc = message.future.exception()
        planned = self.session.planned  # the engine's PlanReady: the plan it carries out now
        if exc is not None:
            self.session.replan_refused()  # back to what the engine really carries out
            self.say(f"re-plan refused: {exc}", "error", timeout=10)
        else:
            self.say(message.future.result().summary, timeout=6)
        if self.session.phase == "plan":
            self.refresh_plan_views()
        if self.live_screen is not None and planned is not None:
            self.live_screen.show_plan(planned.plan)
            self._live_status()  # the header's "resident layers N": the policy the engine now runs

    def on_plan_screen_edit_selected(self: ConsoleHost, message: PlanScreen.EditSelected) -> None:
        self.action_edit(message.what, message.name)

    def on_plan_screen_ready(self: ConsoleHost, _message: PlanScreen.Ready) -> None:
        self.refresh_plan_views()

    def link_info(self: ConsoleHost) -> LinkInfo:
        """The device side of the forecast: bandwidth (given, measured or observed) and free memory."""
        session = self.session
        return link_info(self.device_info, self.snapshot, session.bandwidth, session.bandwidth_source,
                         self.router.observed.rate, session.live_replan)

    def engine_answers(self: ConsoleHost, kind: str) -> EngineAnswers:
        """Answers computed on the engine thread, each posted back here as `EngineAnswered(kind, ...)`."""
        answers = EngineAnswers(self.worker.call,
                                lambda key, f: self._post_from_worker(EngineAnswered(kind, answers, key, f)))
        return answers

    def on_engine_answered(self: ConsoleHost, message: EngineAnswered) -> None:
        """A forecast from the engine thread (the plan screen's or the generate dialog's): kept when it is still
        the one shown, and shown."""
        answers = message.answers
        if not isinstance(answers, EngineAnswers):
            return
        exc = answers.answered(message.key, message.future)
        if exc is not None:
            self.say(f"request forecast failed: {type(exc).__name__}: {exc}", "warning")
        if message.kind == "plan" and answers is self.plan_forecasts:
            self._plan_forecast_answered()
        elif answers is self.ram_plans:
            self._show_ram()
        elif answers is self.dialog_forecasts and isinstance(self.screen, GenerateDialog):
            self.screen.show_forecast()

    def request_forecast(self: ConsoleHost) -> RequestForecast | None:
        """The whole request's forecast for the plan on screen, at the last request's size; None while the
        engine thread computes it (`forecast_pending`).

        It reads the streamer's observed bandwidth and the profile cache, so it is asked of the engine
        thread and kept until the policy, the size, the link rate or the number of requests run changes
        (telemetry redraws ask for it often); its answer redraws the forecast (`on_engine_answered`)."""
        session = self.session
        plan, size, bandwidth = session.plan, session.request_size, session.bandwidth
        key = (plan.policy, size, bandwidth, self.router.request_id)
        answer = self.plan_forecasts.get(key, request_forecast_of(size, plan, bandwidth))
        return None if answer is PENDING else answer

    @property
    def forecast_pending(self: ConsoleHost) -> bool:
        """The plan screen's request forecast is still on its way from the engine thread."""
        return self.plan_forecasts.pending

    def refresh_plan_views(self: ConsoleHost) -> None:
        """Re-render the plan screen (table, policy JSON, forecast, header) for the current policy."""
        link, plan = self.link_info(), self.session.plan
        self._link_shown = (link, plan.policy, self.snapshot)
        forecast = self.request_forecast()
        self.plan_screen.cache = self.session.cache
        self.plan_screen.show_plan(plan, link, self._header(forecast), forecast, self.forecast_pending)
        self._show_ram()
        self._settled_if_forecast()

    def _show_ram(self: ConsoleHost) -> None:
        """The plan screen's `--ram-budget` panel for the plan on screen (asked of the engine thread once per
        policy, size and link rate)."""
        budget = self.ram_budget
        if budget is None:
            return
        session = self.session
        plan, size, bandwidth = session.plan, session.request_size, session.bandwidth
        answer = self.ram_plans.get((plan.policy, size, bandwidth, budget), ram_plan_of(plan, size, bandwidth, budget))
        self.plan_screen.show_ram(None if answer is PENDING else answer, self.ram_plans.pending)

    def _refresh_link(self: ConsoleHost) -> None:
        """After a telemetry sample: re-render forecast and header only when what they show changed."""
        link, plan = self.link_info(), self.session.plan
        header = self._header(self.request_forecast())
        shown = (link, plan.policy, header)
        if shown != self._link_shown:
            self._link_shown = shown
            self._show_link(link, header)

    def _show_link(self: ConsoleHost, link: LinkInfo, header: str) -> None:
        forecast = self.request_forecast()
        self.plan_screen.cache = self.session.cache
        self.plan_screen.show_link(self.session.plan, link, header, forecast, self.forecast_pending)
        self._settled_if_forecast()

    def _settled_if_forecast(self: ConsoleHost) -> None:
        """The plan screen's first paint waits for its request forecast (console/first_paint.py)."""
        if not self.forecast_pending:
            self.first_paint.settled()

    def _plan_forecast_answered(self: ConsoleHost) -> None:
        """The engine thread's request forecast is in: the plan screen's forecast shows it."""
        if self.session.phase in ("plan", "loading") and self.plan_screen.is_mounted:
            self._show_link(self.link_info(), self._header(self.request_forecast()))

    def _header(self: ConsoleHost, forecast: RequestForecast | None) -> str:
        """The plan screen's header, with the host forecast's peak next to the machine's RAM."""
        host = forecast.host if forecast is not None else None
        return header_text(self.model, self.device_info, self.snapshot, host.peak_bytes if host else None)

    def _bandwidth_done(self: ConsoleHost, message: CommandDone) -> None:
        exc = message.future.exception()
        if exc is not None or message.future.result() is None:
            self.say(f"host→device bandwidth not measured: {exc}", "warning")
            return
        self.session.bandwidth_measured(float(message.future.result()))
        if self.session.phase == "plan":
            self.refresh_plan_views()
