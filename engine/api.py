"""The engine's front door: a small object model, not a list of names. The console imports nothing else
below it but `engine.events`, `engine.errors` and `offload.units` (import-linter contracts in pyproject.toml),
and at most 30 names in all from below (tests/console/test_front_door_names.py counts them).

- The nouns a face holds: `EngineHandle` (one GPU's `Engine` or a rank group's `GroupEngine`), `EngineOptions`,
  `ModelInfo`, `OffloadPolicy`, `Plan`, `RequestSize`, `RequestForecast`, `RankLayout`, `GenerateRequest`,
  `TelemetrySnapshot`, and `plain` / `plain_lines` (a data string made safe to print).
- Six namespaces (engine/front/), each one job: `service` (open an engine, the request service, its worker,
  states, history, results and reports), `planner` (plans, budgets, the one way to a forecast, documents),
  `checks` (a request's rules, before any work), `writes` (atomic outputs, signals), `models` (the model
  directory and the demo model), `probes` (probes, memory setup, telemetry: no console module imports torch).

Names load lazily (PEP 562): `plan` and the console's first frame must not import torch, and most of what
is named here does. `from omni_console.engine.api import X` imports only X's module.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below are the names this module exports, for type checkers)
from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names as `_EXPORTS`, for type checkers (tests/engine/test_api.py holds them equal)
    from ..offload.policy import OffloadPolicy
    from ..offload.telemetry_types import TelemetrySnapshot
    from .front import checks, models, planner, probes, service, writes
    from .handle import EngineHandle
    from .model_dir.discovery import ModelInfo
    from .options import EngineOptions
    from .plain_text import plain, plain_lines
    from .planning.plan import Plan
    from .planning.request_forecast import RequestForecast
    from .planning.request_profile import RequestSize
    from .ranks.rank_layout import RankLayout
    from .running.runner import GenerateRequest

_EXPORTS: dict[str, tuple[str, ...]] = {
    ".handle": ("EngineHandle",),
    ".options": ("EngineOptions",),
    ".model_dir.discovery": ("ModelInfo",),
    "..offload.policy": ("OffloadPolicy",),
    ".planning.plan": ("Plan",),
    ".planning.request_profile": ("RequestSize",),
    ".planning.request_forecast": ("RequestForecast",),
    ".ranks.rank_layout": ("RankLayout",),
    ".running.runner": ("GenerateRequest",),
    "..offload.telemetry_types": ("TelemetrySnapshot",),
    ".plain_text": ("plain", "plain_lines"),
}
"""Each noun's module (relative to `omni_console.engine`)."""

NAMESPACES = ("checks", "models", "planner", "probes", "service", "writes")
"""The namespaces, each a module of engine/front/ (its names load lazily too)."""

_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted([*_WHERE, *NAMESPACES, "open_engine"])


def __getattr__(name: str) -> Any:
    if name in NAMESPACES:
        return importlib.import_module(f".front.{name}", __package__)
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # looked up each time, never cached here: a name patched in its own module is the one served
    return getattr(importlib.import_module(module, __package__), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE, *NAMESPACES})


def open_engine(path: str | Path, device: Any = None, layout: RankLayout | None = None,
                options: EngineOptions | None = None, **kwargs: Any) -> EngineHandle:
    """The engine for the model at `path`: in this process on `device` (default: CUDA when there is
    one), or, with a distributed `layout`, a `GroupEngine` over `layout.gpus` rank processes on
    `device`'s kind. Other keywords go to the engine (`bus`, `variant`; a group's `log_dir`, ...)."""
    import torch

    if layout is None or not layout.distributed:
        from .engine import Engine

        return Engine(path, device=device, options=options, **kwargs)
    from .ranks.group_engine import GroupEngine

    kind = torch.device(device).type if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    return GroupEngine(path, layout, device_kind=kind, options=options, **kwargs)
