"""The plan screen's side of the app: policy edits, the forecast's device link and the header.

Part of `OmniConsoleApp` (a mixin: it shares the app's phase, editor and telemetry). Edits arrive as
the `app.edit(...)` action (d, +, -, m) or the screen's `EditSelected` message (space/enter, x on a
row); each is kept only when the engine can plan it, then every view is redrawn for the new plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.api import RequestForecast, plan_for
from ..offload.units import format_bytes
from .command_done import CommandDone
from .plan_context import LinkInfo, header_text, link_info
from .screens import PlanScreen
from .screens.budget import BudgetDialog

if TYPE_CHECKING:
    from .app import OmniConsoleApp


class PlanCommands:
    """The policy edits and the plan screen's views."""

    def action_edit(self: OmniConsoleApp, what: str, value: object = None) -> bool:
        """d, +, -, m (and the selection's space/enter, x): one policy edit, kept only when it plans.

        With a model loaded the edit is applied live: the engine re-plans between requests (a request
        in flight finishes first), moving only what changes from its pinned masters."""
        if self.phase == "live":
            return self._live_edit(what, value)
        if self.phase != "plan":
            self.say("the policy is read-only while the model is loading or unloading", "warning")
            return False
        applied = self.editor.edit(what, value)
        if applied.kept:
            self.refresh_plan_views()
        self.say(applied.message, applied.severity, timeout=2 if applied.kept else None)
        return applied.kept

    def action_budget(self: OmniConsoleApp) -> None:
        """b: ask for a VRAM budget, then let the planner choose the policy (off the UI thread); with a
        model loaded, the chosen policy is applied by a live re-plan."""
        if self.phase not in ("plan", "live"):
            self.say("the policy is read-only while the model is loading or unloading", "warning")
            return
        self.push_screen(BudgetDialog(device=str(self.engine.device)), self._plan_for_budget)

    def _plan_for_budget(self: OmniConsoleApp, budget: int | None) -> None:
        if budget is None:
            return
        plan, size, bandwidth = self.plan, self.request_size, self.bandwidth
        future = self.worker.call(lambda engine: plan_for(engine, plan, budget, size, bandwidth=bandwidth,
                                                          forecast=False))
        self.say(f"planning for {format_bytes(budget)}…", timeout=2)
        future.add_done_callback(lambda f: self._post_from_worker(CommandDone("budget", f)))

    def _budget_done(self: OmniConsoleApp, message: CommandDone) -> None:
        exc = message.future.exception()
        if exc is not None:
            self.say(str(exc), "error")
            return
        planned = message.future.result()
        if self.action_edit("policy", planned.plan.policy):
            self.say("\n".join([f"VRAM budget {format_bytes(planned.auto.budget)}:", *planned.reasons]), timeout=12)

    def _live_edit(self: OmniConsoleApp, what: str, value: object) -> bool:
        if what == "mode":
            self.say("switching dlo ⇄ resident is a new load: u unloads, then m and l", "warning")
            return False
        applied = self.editor.edit(what, value)
        if not applied.kept:
            self.say(applied.message, applied.severity)
            return False
        policy = self.editor.policy
        future = self.worker.call(lambda engine: engine.replan(policy))
        future.add_done_callback(lambda f: self._post_from_worker(CommandDone("replan", f)))
        queued = " (queued: the request in flight finishes first)" if self.generating else ""
        self.say(f"{applied.message} · re-planning{queued}…", timeout=3)
        return True  # the plan screen is redrawn when it is shown again (after u)

    def _replan_done(self: OmniConsoleApp, message: CommandDone) -> None:
        exc = message.future.exception()
        plan = self.engine.plan
        if exc is not None:
            if plan is not None:  # back to what the engine really carries out
                self.editor.policy, self.editor.plan = plan.policy, plan
            self.say(f"re-plan refused: {exc}", "error", timeout=10)
        else:
            self.say(message.future.result().summary, timeout=6)
        if self.phase == "plan":
            self.refresh_plan_views()
        if self.live_screen is not None and plan is not None:
            self.live_screen.show_plan(self.engine.plan)
            self._live_status()  # the header's "resident layers N": the policy the engine now runs

    def on_plan_screen_edit_selected(self: OmniConsoleApp, message: PlanScreen.EditSelected) -> None:
        self.action_edit(message.what, message.name)

    def on_plan_screen_ready(self: OmniConsoleApp, _message: PlanScreen.Ready) -> None:
        self.refresh_plan_views()

    def link_info(self: OmniConsoleApp) -> LinkInfo:
        """The device side of the forecast: bandwidth (given, measured or observed) and free memory."""
        return link_info(self.device_info, self.snapshot, self.bandwidth, self.bandwidth_source,
                         self.router.observed.rate, self.engine.live_replan)

    def request_forecast(self: OmniConsoleApp) -> RequestForecast | None:
        """The whole request's forecast for the plan on screen, at the last request's size.

        It reads the profile cache (small files, never the device); kept until the policy, the size,
        the link rate or the number of requests run changes, since telemetry redraws ask for it often."""
        key = (self.plan.policy, self.request_size, self.bandwidth, self.router.request_id)
        cached = getattr(self, "_request_forecast", None)
        if cached is None or cached[0] != key:
            cached = (key, self.engine.forecast(self.request_size, plan=self.plan, probe_bandwidth=self.bandwidth))
            self._request_forecast = cached
        return cached[1]

    def refresh_plan_views(self: OmniConsoleApp) -> None:
        """Re-render the plan screen (table, policy JSON, forecast, header) for the current policy."""
        link = self.link_info()
        self._link_shown = (link, self.plan.policy, self.snapshot)
        self.plan_screen.show_plan(self.plan, link, header_text(self.engine.model, self.device_info, self.snapshot),
                                   self.request_forecast())

    def _refresh_link(self: OmniConsoleApp) -> None:
        """After a telemetry sample: re-render forecast and header only when what they show changed."""
        link = self.link_info()
        header = header_text(self.engine.model, self.device_info, self.snapshot)
        shown = (link, self.plan.policy, header)
        if shown != self._link_shown:
            self._link_shown = shown
            self.plan_screen.show_link(self.plan, link, header, self.request_forecast())

    def _bandwidth_done(self: OmniConsoleApp, message: CommandDone) -> None:
        exc = message.future.exception()
        if exc is not None or message.future.result() is None:
            self.say(f"host→device bandwidth not measured: {exc}", "warning")
            return
        self.bandwidth = float(message.future.result())
        self.bandwidth_source = "measured: best of 4 pinned 256 MiB copies"
        if self.phase == "plan":
            self.refresh_plan_views()
