"""The engine's states and their guards, shared by `Engine` and `GroupEngine` so both refuse the same
commands with the same words and fail the same way (torch-free).

discovered → loading → ready ⇄ running, plus failed and unloaded: every state change and failure is
an event on the engine's bus, so the console follows them without touching the engine.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ..offload.events import ErrorEvent, EventBus
from .events import EngineStateChanged, PlanReady
from .running.pipeline_defaults import default_side, default_steps

if TYPE_CHECKING:
    from .planning.plan import Plan


class EngineState(StrEnum):
    DISCOVERED = "discovered"
    LOADING = "loading"
    READY = "ready"
    RUNNING = "running"
    FAILED = "failed"
    UNLOADED = "unloaded"


class EngineStateError(RuntimeError):
    """A command that the engine's current state does not allow (e.g. generate before load)."""


IDLE_STATES = (EngineState.DISCOVERED, EngineState.UNLOADED, EngineState.FAILED)
"""Nothing is held in these: `close` has nothing to release."""


class Lifecycle:
    """State, failure and the guards around them; the engine sets `bus`, `state`, `failure`, `plan` and
    `pipe`. Becoming ready with a plan not yet announced publishes it first (`PlanReady`)."""

    bus: EventBus
    state: EngineState
    failure: str | None
    plan: Plan | None
    pipe: Any  # the loaded pipeline in this process (None for a rank group's)
    _announced: Plan | None = None

    def _set_state(self, new: EngineState, reason: str = "") -> None:
        if new == EngineState.READY and self.plan is not None and self.plan is not self._announced:
            self._announce_plan()
        old, self.state = self.state, new
        self.bus.publish(EngineStateChanged(old=old.value, new=new.value, reason=reason))

    def _announce_plan(self) -> None:
        """Publish the plan carried out now and the loaded pipeline's request defaults (read here, on the
        engine's thread; none for a pipeline in other processes)."""
        plan, pipe = self.plan, self.pipe
        assert plan is not None
        self._announced = plan
        side = default_side(pipe) if pipe is not None else None
        self.bus.publish(PlanReady(plan=plan, steps=default_steps(pipe) if pipe is not None else None,
                                   height=side, width=side))

    def _fail(self, where: str, reason: str) -> None:
        """The command `where` failed: the reason is kept, said as an error event, and the state is failed."""
        self.failure = reason
        self.bus.publish(ErrorEvent(where=where, message=reason))
        self._set_state(EngineState.FAILED, reason)

    def _check_loadable(self) -> None:
        if self.state in (EngineState.LOADING, EngineState.READY, EngineState.RUNNING):
            raise EngineStateError(f"cannot load while {self.state.value}; unload first")

    def _check_ready(self, what: str = "generate") -> None:
        if self.state != EngineState.READY:
            raise EngineStateError(f"cannot {what} while {self.state.value}; load first")

    def _check_unloadable(self) -> None:
        if self.state == EngineState.RUNNING:
            raise EngineStateError("cannot unload while a request is running")

    @property
    def holds_anything(self) -> bool:
        """A load began and was not released: `close` must release it."""
        return self.state not in IDLE_STATES
