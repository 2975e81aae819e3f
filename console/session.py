"""The console's state machine without Textual: phase, the command in flight, the request running, the
policy being edited and what the engine last said about itself.

The app (`app.py`) and its command groups (`*_commands.py`) keep only Textual glue: they ask the
session whether a key may act now (`allows`, `refuse_*`: the words the operator is told) and move it
through its transitions; the engine's side arrives as events, handed over by the event router
(`follow`): the plan the engine carries out and the pipeline's request defaults (`PlanReady`), its
state and failure (`EngineStateChanged`). So the whole life of a session is unit-tested without a
terminal (tests/console/test_session.py), and the UI thread never reads the engine's objects.

Phases: plan → loading → live → unloading → plan, and quitting from any of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..engine import events
from ..engine.api import RequestSize

if TYPE_CHECKING:
    from ..engine.api import GenerateRequest, OffloadPolicy, Plan, checks
    from .policy_edits import PolicyEditor

Phase = Literal["plan", "loading", "live", "unloading", "quitting"]
Refusal = tuple[str, str]
"""What the operator is told when a key cannot act now: (message, severity)."""

READ_ONLY = "the policy is read-only while the model is loading or unloading"


class ConsoleSession:
    """One console's state and its transitions (no Textual, no engine objects)."""

    def __init__(self, editor: PolicyEditor, *, live_replan: bool, engine_state: str, prompt: str,
                 bandwidth: float | None = None) -> None:
        """`live_replan`: the engine's loads take another policy without a new load (an engine option,
        fixed for its life). `engine_state`: its state when the console opens."""
        self.editor = editor
        self.live_replan = live_replan
        self.phase: Phase = "plan"
        self.generating = False
        """A request is running or queued (from the first's start until the last's outcome is shown)."""
        self.busy: Future | None = None
        """The worker command in flight that the app started last (None once it is done)."""
        self.last_command: dict[str, Future] = {}
        self.prompt = prompt
        self.request_size = RequestSize()  # the size the plan screen's forecast is for: the last request's
        self.last_requests: dict[str, GenerateRequest] = {}  # per model path: the generate dialog's values
        self.load_seconds: float | None = None
        self.last_error: str | None = None
        self.last_output: Path | None = None
        self.last_budget = ""
        """The budget as the operator last entered it in the `b` dialog (its next opening starts from it)."""
        self.exit_code = 0
        self.bandwidth = bandwidth
        self.bandwidth_source = "given" if bandwidth else ""
        self.engine_state = engine_state
        self.failure: str | None = None
        """Why the engine last failed (its `failed` state change's reason), until a load starts."""
        self.planned: events.PlanReady | None = None
        """The plan the engine carries out now and its pipeline's defaults; None while nothing is loaded."""
        self.cache: checks.CacheSpec | None = None
        """The step cache the next request takes (console --cache, `s` on the live screen, the dialog's field)."""

    @property
    def policy(self) -> OffloadPolicy:
        """The policy being edited (the one the next load or live re-plan applies)."""
        return self.editor.policy

    @property
    def plan(self) -> Plan:
        return self.editor.plan

    @property
    def running_policy(self) -> OffloadPolicy:
        """The policy the engine carries out (the edited one until the engine has said)."""
        return self.planned.plan.policy if self.planned is not None else self.policy

    # ---- the engine's events -------------------------------------------------------------

    def follow(self, batch: Iterable[events.Event]) -> None:
        """Take this process's engine's `PlanReady` and `EngineStateChanged` events (in order)."""
        for event in batch:
            if event.rank is not None:
                continue  # a rank's own engine: the group speaks for it
            if isinstance(event, events.PlanReady):
                self.planned = event
                self.editor.model = event.plan.model  # the engine's model: a corrected block order included
            elif isinstance(event, events.EngineStateChanged):
                self.engine_state = event.new
                if event.new == "failed":
                    self.failure = event.reason
                if event.new in ("loading", "failed", "unloaded"):
                    self.planned = None
                if event.new == "loading":
                    self.failure = None

    # ---- what a key may do now -----------------------------------------------------------

    def allows(self, action: str, *, on_plan_screen: bool) -> bool | None:
        """Whether the screens' `app.` action may run now: True, None (shown greyed) or False (hidden)."""
        if action == "load":
            return True if self.phase == "plan" else None
        if action in ("edit", "budget"):  # live too, when the model was loaded for live re-plans
            live = self.phase == "live" and self.live_replan
            return True if self.phase == "plan" or live else None
        if action == "cancel" and on_plan_screen:
            return self.phase != "plan"  # esc is offered on the plan screen only while a load runs
        # g and u keep one state for the whole life of the live screen: flipping them when a request
        # starts or ends made Textual rebuild the footer right then (~0.1 s of UI thread), delaying the
        # first key an operator presses. Their actions refuse politely instead.
        if action in ("generate", "unload"):
            return True if self.phase == "live" else None
        return True

    def refuse_load(self) -> Refusal | None:
        if self.phase != "plan":
            return ("already loaded or busy; u unloads first" if self.phase == "live" else f"busy ({self.phase})",
                    "warning")
        return None

    def refuse_unload(self) -> Refusal | None:
        if self.phase != "live":
            return "nothing loaded", "warning"
        if self.generating:
            return "a request is running or queued; esc cancels it, the queue panel's X clears the rest", "warning"
        return None

    def refuse_generate(self) -> Refusal | None:
        """`g` while a request runs is not refused: the request joins the engine's queue."""
        if self.phase != "live":
            return "load the model first (l)", "warning"
        return None

    def refuse_cache_change(self) -> Refusal | None:
        """`s` between requests only: a request's cache is enabled for its whole run (diffusers' hooks keep
        their state from step to step), so it cannot change while one runs or waits."""
        if self.phase != "live":
            return "load the model first (l)", "warning"
        if self.generating:
            return ("the step cache changes between requests: a request is running or queued with its own "
                    "(s again once it ends)", "warning")
        return None

    def cycle_cache(self, kinds: Sequence[str]) -> checks.CacheSpec | None:
        """`s`: off → each kind the family's denoiser takes (diffusers' default parameters) → off. The next
        request takes it; a setting with parameters (from the dialog) goes on to the next kind."""
        from ..engine.api import checks

        order = ["off", *kinds]
        now = self.cache.kind if self.cache is not None else "off"
        following = order[(order.index(now) + 1) % len(order)] if now in order else order[min(1, len(order) - 1)]
        self.cache = None if following == "off" else checks.CacheSpec(following)
        return self.cache

    def refuse_budget(self) -> Refusal | None:
        return None if self.phase in ("plan", "live") else (READ_ONLY, "warning")

    def may_cancel(self) -> bool:
        """esc stops something: a load, or a request."""
        return self.phase == "loading" or self.generating

    # ---- transitions -----------------------------------------------------------------------

    def track(self, kind: str, future: Future) -> Future:
        """A worker command started: it is the one in flight, and the last of its kind."""
        self.busy = self.last_command[kind] = future
        return future

    def command_done(self, future: Future) -> None:
        if future is self.busy:
            self.busy = None

    def load_started(self) -> None:
        self.phase = "loading"
        self.last_error = None
        self.load_seconds = None

    def load_succeeded(self, seconds: float) -> None:
        self.phase = "live"
        self.load_seconds = seconds

    def load_failed(self, exc: BaseException) -> str:
        """A load failed or was cancelled: back to the plan; the reason (the engine's, else the error's)."""
        reason = self.failure or f"{type(exc).__name__}: {exc}"
        self.phase = "plan"
        self.last_error = reason
        return reason

    def unload_started(self) -> None:
        self.phase = "unloading"

    def unload_failed(self) -> None:
        self.phase = "live"

    def unloaded(self) -> None:
        """Nothing is loaded any more (an unload, or a rank group that stopped)."""
        self.phase = "plan"

    def request_started(self, request: GenerateRequest, model_path: str, size: RequestSize) -> None:
        """A request goes to the worker: the dialog opens with its values next time for this model, and the
        plan screen's forecast is for its size."""
        self.prompt = request.prompt
        self.last_requests[model_path] = request
        self.cache = request.cache  # the dialog's cache is the next one's too (`s` shows and changes it)
        self.request_size = size
        self.generating = True

    def request_ended(self, error: str | None = None, output: Path | None = None, queued: bool = False) -> None:
        """A request's outcome is shown; `queued`: others still run or wait (the session stays generating)."""
        self.generating = queued
        if error is not None:
            self.last_error = error
        if output is not None:
            self.last_output = output

    def replan_refused(self) -> None:
        """The engine refused a live re-plan: the editor goes back to what the engine carries out."""
        if self.planned is not None:
            self.editor.policy, self.editor.plan = self.planned.plan.policy, self.planned.plan

    def bandwidth_measured(self, rate: float) -> None:
        self.bandwidth = rate
        self.bandwidth_source = "measured: best of 4 pinned 256 MiB copies"

    def quit(self) -> bool:
        """q: False when already quitting (the second q does nothing)."""
        if self.phase == "quitting":
            return False
        self.phase = "quitting"
        return True
