"""`ConsoleHost`: what the command groups (`load_commands`, `plan_commands`, `request_commands`) and the
command palette (`commands`) use of the app, so none of them imports the app's class (no import circle,
`TYPE_CHECKING` imports counted: tests/console/test_import_cycles.py).

The state they act on is the app's `ConsoleSession` (no Textual); the rest is the app's Textual glue
(screens, toasts, messages from the worker thread) and the worker commands go down through.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from textual.message import Message
    from textual.screen import Screen

    from ..engine.api import (
        EngineHandle,
        GenerateRequest,
        ModelInfo,
        RequestForecast,
        TelemetrySnapshot,
        probes,
        service,
    )
    from .engine_answers import EngineAnswers
    from .event_router import EventRouter
    from .first_paint import FirstPaint
    from .lora_set import LoraSet
    from .request_queue import QueueRows
    from .request_report import RequestReporter
    from .screens import LiveScreen, PlanScreen
    from .session import ConsoleSession


class ConsoleHost(Protocol):
    """The app as its command groups see it (`OmniConsoleApp` is the one implementation)."""

    session: ConsoleSession
    engine: EngineHandle
    """Only to hand to worker commands (`worker.call(lambda engine: ...)`) and to the request defaults."""
    model: ModelInfo
    """The model directory's components as discovered when the console opened (a value, not the engine's)."""
    engine_device: str
    """The engine's device as it was given (`cuda`, `cuda:1`, `cpu`)."""
    @property
    def world(self) -> int:
        """GPUs (ranks) serving the model (a constant of the engine handle)."""
        ...
    worker: service.EngineWorker
    plan_forecasts: EngineAnswers
    """The plan screen's request forecast, computed on the engine thread."""
    dialog_forecasts: EngineAnswers
    ram_plans: EngineAnswers
    """The plan screen's `--ram-budget` tiers, planned on the engine thread."""
    ram_budget: int | None
    """`--ram-budget`'s bytes (None: no host budget)."""
    """The generate dialog's forecasts, computed on the engine thread (a new one per dialog)."""
    router: EventRouter
    device_info: probes.DeviceInfo
    plan_screen: PlanScreen
    first_paint: FirstPaint
    """Holds the app's paints until the plan screen has its request forecast (console/first_paint.py)."""
    live_screen: LiveScreen | None
    service: service.RequestService
    """The engine's request service: the queue every request goes through (created on this worker)."""
    reporter: RequestReporter
    queue_rows: QueueRows
    submitted: int
    cancelled_request: int | None
    out_dir: Path
    save_partial: bool
    lora_set: LoraSet
    lora_chosen_mode: str | None
    _link_shown: object

    # ---- Textual's App
    @property
    def screen(self) -> Screen: ...
    @property
    def screen_stack(self) -> list[Screen]: ...
    def push_screen(self, screen: Screen, callback: Callable[[Any], None] | None = None) -> Any: ...
    def pop_screen(self) -> Any: ...

    # ---- the app's glue
    @property
    def snapshot(self) -> TelemetrySnapshot | None: ...
    def say(self, message: str, severity: str = "information", timeout: float | None = None) -> None: ...
    def _post_from_worker(self, message: Message) -> None: ...
    def engine_answers(self, kind: str) -> EngineAnswers: ...
    def _track(self, kind: str, future: Future) -> Future: ...
    def _live_status(self) -> None: ...

    # ---- the command groups' own, which they call across groups
    def refresh_plan_views(self) -> None: ...
    def _show_ram(self) -> None: ...
    def request_forecast(self) -> RequestForecast | None: ...
    @property
    def forecast_pending(self) -> bool: ...
    def _plan_forecast_answered(self) -> None: ...
    def back_to_plan(self, notice: str, severity: str = "information") -> None: ...
    def _drop_live_screen(self) -> None: ...
    def action_edit(self, what: str, value: object = None) -> bool: ...
    def request_forecast_line(self, request: GenerateRequest) -> str: ...
    def cache_kinds(self) -> tuple[str, ...]: ...
    _cache_kinds: tuple[str, ...] | None
    def start_generate(self, request: GenerateRequest | None) -> Future | None: ...
    def ask_queue_forecast(self, ticket: Any) -> None: ...
    def show_queue(self) -> None: ...
    def _queued_request_started(self, number: int) -> None: ...
    def _write_then_finish(self, ticket: Any, done: Future) -> None: ...
    def _save_rank_results(self, result: Any) -> None: ...

    # ---- the actions the command palette offers
    def action_load(self) -> Future | None: ...
    def action_unload(self) -> Future | None: ...
    def action_generate(self) -> None: ...
    def action_cycle_cache(self) -> None: ...
    def action_cancel(self) -> None: ...
    def action_copy_command(self) -> None: ...
    def action_cycle_theme(self) -> None: ...
    def action_help(self) -> None: ...

    def action_history(self) -> None: ...
