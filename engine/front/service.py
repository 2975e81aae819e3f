"""Running requests: the engine's worker and states, the request service, its history, results and reports.

One namespace of the engine's front door (`from omni_console.engine.api import service`); names load lazily.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports are this namespace's names, for type checkers)
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:  # the same names as `EXPORTS` (tests/engine/test_api.py holds them equal)
    from ..api import open_engine
    from ..engine import Engine
    from ..lifecycle import EngineState, EngineStateError
    from ..loading.loader import LoadCancelled
    from ..ranks.group_engine import GroupEngine
    from ..ranks.rank_group import RankFailed
    from ..results import GenerateResult, LoadReport
    from ..running.runner import RequestCancelled
    from ..service import request_events
    from ..service.checks import CheckedRun, check_model_request, check_run
    from ..service.event_drain import EventDrain
    from ..service.history import History, HistoryEntry
    from ..service.outputs import Written, frames_of, write_outputs
    from ..service.rank_report import RankRun, RanksReport, rank_outputs, ranks_report, seeded_path
    from ..service.report import run_report, served_report
    from ..service.run_once import CancelPoints, NoSignals, RunDone, RunFace, RunSpec, run_once
    from ..service.run_plan import RunPlan, plan_run, run_options
    from ..service.run_ranks import run_ranks
    from ..service.run_report import RunReport
    from ..service.run_totals import RunTotals
    from ..service.service import Outcome, RequestService, Ticket, request_of
    from ..service.trace import TraceCapture
    from ..worker import EngineWorker

EXPORTS: dict[str, tuple[str, ...]] = {
    "..service": ("request_events",),
    "..engine": ("Engine",),
    "..ranks.group_engine": ("GroupEngine",),
    "..worker": ("EngineWorker",),
    "..lifecycle": ("EngineState", "EngineStateError"),
    "..service.service": ("Outcome", "RequestService", "Ticket", "request_of"),
    "..service.checks": ("CheckedRun", "check_model_request", "check_run"),
    "..service.history": ("History", "HistoryEntry"),
    "..service.outputs": ("Written", "frames_of", "write_outputs"),
    "..service.report": ("run_report", "served_report"),
    "..service.run_plan": ("RunPlan", "plan_run", "run_options"),
    "..service.run_once": ("CancelPoints", "NoSignals", "RunDone", "RunFace", "RunSpec", "run_once"),
    "..service.run_ranks": ("run_ranks",),
    "..service.event_drain": ("EventDrain",),
    "..service.run_report": ("RunReport",),
    "..service.rank_report": ("RankRun", "RanksReport", "rank_outputs", "ranks_report", "seeded_path"),
    "..service.run_totals": ("RunTotals",),
    "..service.trace": ("TraceCapture",),
    "..results": ("GenerateResult", "LoadReport"),
    "..loading.loader": ("LoadCancelled",),
    "..running.runner": ("RequestCancelled",),
    "..ranks.rank_group": ("RankFailed",),
    "..api": ("open_engine",),
}
"""Each name's module (relative to this package)."""

__getattr__, __dir__, __all__ = lazy_names(__name__, __package__, EXPORTS)
