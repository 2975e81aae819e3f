"""Load and unload: the plan screen's `l` and the live screen's `u`, and what their results change.

Part of `OmniConsoleApp` (a mixin over the `ConsoleHost` protocol: the session's phase, the screens,
the worker). A load builds a fresh live screen that collects the load's events (through the event
router) before it is shown; a failed or cancelled load, like an unload, drops it and returns to the
plan screen.
"""

from __future__ import annotations

import gc
from concurrent.futures import Future
from typing import TYPE_CHECKING

from ..engine.api import service
from ..engine.errors import PolicyError
from ..offload.units import format_bytes, format_seconds
from .command_done import CommandDone
from .plan_commands import load_tiers_of
from .screens import LiveScreen
from .widgets.lora_panel import LoraPanel

if TYPE_CHECKING:
    from .host import ConsoleHost


class LoadCommands:
    """l and u for the app, and their outcomes."""

    def action_load(self: ConsoleHost) -> Future | None:
        """l: load with the current policy on the worker thread; progress arrives as events."""
        session = self.session
        refusal = session.refuse_load()
        if refusal is not None:
            self.say(*refusal)
            return None
        try:
            plan = session.editor.replan()
        except PolicyError as exc:
            self.say(str(exc), "error")
            return None
        session.load_started()
        # fresh panels per load; it collects events until shown
        self.live_screen = LiveScreen(on_cpu=not self.device_info.is_cuda, history=self.router.telemetry_history,
                                      live_policy=session.live_replan, world=self.world,
                                      previews=getattr(self, "preview_mode", "halfblock") != "off",
                                      preview_protocol=getattr(self, "preview_mode", "halfblock"),
                                      loras=LoraPanel(self.lora_set, self.lora_chosen_mode) if self.lora_set else None)
        self.live_screen.show_plan(plan)
        self.router.start_load(self.live_screen)
        self.plan_screen.load_started()
        tiers = None  # --ram-budget: where each block master lives (pinned, page cache, disk) for this policy
        if self.ram_budget is not None:
            tiers = load_tiers_of(plan, session.request_size, session.bandwidth, self.ram_budget)
        future = self.worker.load(session.policy, tiers)
        future.add_done_callback(self.reporter.load_done)  # on the engine thread, before the UI hears of it
        return self._track("load", future)

    def action_unload(self: ConsoleHost) -> Future | None:
        """u: unload (memory released) and return to the plan screen."""
        refusal = self.session.refuse_unload()
        if refusal is not None:
            self.say(*refusal)
            return None
        self.session.unload_started()
        gc.unfreeze()  # the model's objects must be collectable again when the engine releases them
        self.screen.refresh_bindings()
        return self._track("unload", self.worker.unload())

    def _load_done(self: ConsoleHost, message: CommandDone) -> None:
        if self.session.phase != "loading":
            return  # quitting
        exc = message.future.exception()
        if exc is None:
            report = message.future.result()
            self.session.load_succeeded(report.seconds)
            gc.freeze()  # the loaded model and the UI: never rescanned by the collector (module docstring)
            self.plan_screen.load_ended(None)
            live = self.live_screen
            assert live is not None
            if self.session.planned is not None:  # the plan the engine carries out: its host tiers too
                live.show_plan(self.session.planned.plan)
            self._live_status()
            self.push_screen(live)
            pinned = f" · pinned host {format_bytes(report.pinned_bytes)}" if report.pinned_bytes else ""
            split = ", ".join(f"{k} {format_seconds(v)}" for k, v in report.phases.items() if v >= 0.0005)
            split = f" ({split})" if split else ""
            self.say(f"loaded in {format_seconds(report.seconds)}{split}{pinned} · g generates, u unloads")
            return
        cancelled = isinstance(exc, service.LoadCancelled)
        reason = self.session.load_failed(exc)
        self._drop_live_screen()
        self.plan_screen.load_ended(reason, cancelled=cancelled)
        self.refresh_plan_views()
        self.say("load cancelled; memory released" if cancelled else f"load failed: {reason}",
                 "warning" if cancelled else "error", timeout=10)

    def _drop_live_screen(self: ConsoleHost) -> None:
        self.live_screen = None
        self.router.detach()

    def _unload_done(self: ConsoleHost, message: CommandDone) -> None:
        if self.session.phase != "unloading":
            return
        exc = message.future.exception()
        if exc is not None:
            self.session.unload_failed()
            self.say(f"unload failed: {type(exc).__name__}: {exc}", "error")
            return
        self.back_to_plan("unloaded; memory released — edit the policy and press l to load again")

    def back_to_plan(self: ConsoleHost, notice: str, severity: str = "information") -> None:
        """Nothing is loaded any more (an unload, or a rank group that stopped): the plan screen again."""
        self.session.unloaded()
        gc.unfreeze()  # the released model's objects must be collectable
        while self.screen is not self.plan_screen and len(self.screen_stack) > 1:
            self.pop_screen()
        self._drop_live_screen()
        self.refresh_plan_views()
        self.say(notice, severity)

