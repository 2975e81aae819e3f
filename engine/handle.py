"""`EngineHandle`: what the console may use of an engine, one GPU's (`Engine`) or a rank group's
(`GroupEngine`). Both implement it for real (tests/engine/test_api.py holds them to it), so the
console needs no `getattr` guesses. Torch-free to import: the types are named for the checker only.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from ..offload.events import EventBus
    from ..offload.policy import OffloadPolicy
    from .lifecycle import EngineState
    from .model_dir.discovery import ModelInfo
    from .planning.plan import Plan
    from .planning.request_forecast import RequestForecast
    from .planning.request_profile import RequestSize
    from .results import GenerateResult, LoadReport
    from .running.runner import GenerateRequest


@runtime_checkable
class EngineHandle(Protocol):
    """An engine serving one model: plan, load, run, re-plan and release; everything else it says
    arrives as events on `bus`. Methods block: the console calls them on its worker thread.

    The loaded pipeline and placement are not part of it: they are the engine's own (in this process
    only), and a face learns what they hold from events (`ResidencySnapshot`, `PlanReady`)."""

    model: ModelInfo
    bus: EventBus
    state: EngineState
    failure: str | None
    plan: Plan | None

    @property
    def device(self) -> torch.device: ...

    @property
    def device_name(self) -> str: ...

    @property
    def world(self) -> int:
        """GPUs (ranks) serving the model."""
        ...

    @property
    def live_replan(self) -> bool:
        """A loaded model takes another policy without a new load (`replan`)."""
        ...

    @property
    def fps(self) -> float | None: ...

    def make_plan(self, policy: OffloadPolicy) -> Plan: ...

    def forecast(self, size: RequestSize, plan: Plan | None = None, probe_bandwidth: float | None = None
                 ) -> RequestForecast | None: ...

    def prepare(self, cancel: threading.Event | None = None) -> float: ...

    def load(self, policy: OffloadPolicy, cancel: threading.Event | None = None, tiers: Any = None) -> LoadReport: ...

    def replan(self, policy: OffloadPolicy) -> Any: ...

    def generate(self, request: GenerateRequest, cancel: threading.Event | None = None) -> GenerateResult: ...

    def unload(self) -> None: ...

    def close(self) -> None: ...
