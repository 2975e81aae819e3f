"""`run`'s plan for one checked request, before load: the budget's choice, the host tiers, the lean phases,
and the lines the operator reads about them. The CLI prints the lines; the decisions are made here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..options import EngineOptions
from ..plan_flow import loads_live, plan_for
from ..planning.compile_plan import budget_workspace, recorded_workspace
from ..running.host_fit import check_fits_host
from ..running.profiler import request_size

if TYPE_CHECKING:
    from ...offload.policy import OffloadPolicy
    from ..handle import EngineHandle
    from ..planning.plan import Plan
    from ..running.runner import GenerateRequest


@dataclass(frozen=True)
class RunPlan:
    """The plan `run` loads and what its report says of it: `policy` (the budget's, when it chose one),
    the device `overhead` the budget counted, `reasons` (--vram-budget's), `ram` (--ram-budget's answer)
    and `lean` (the lean phases in effect, each with its cost); `notes`: the lines for stderr."""

    plan: Plan
    policy: OffloadPolicy
    overhead: Any = None
    reasons: list[str] = field(default_factory=list)
    ram: Any = None
    lean: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run_options(budget: int | None, ram_budget: int | None) -> EngineOptions:
    """How `run` opens its engine: with a budget, live re-plan masters, so an out-of-memory step-down can
    move resident blocks (oom_guard), unless a `--ram-budget` plans the host (`loads_live`)."""
    return EngineOptions(live_replan=loads_live(budget, ram_budget))


def plan_run(engine: EngineHandle, plan: Plan, budget: int | None, ram_budget: int | None,
             request: GenerateRequest) -> RunPlan:
    """`plan` (the operator's policy, planned) for `request`, as `run` will load it: with a budget the
    auto-planner's choice (nothing fits: ConfigError, exit 2), with a RAM budget its host tiers."""
    workspace, held = budget_workspace(plan, *_compile_asked(engine, plan, request))
    planned = plan_for(engine, plan, budget - workspace if budget is not None else None, request_size(request),
                       ram_budget=ram_budget, live=loads_live(budget, ram_budget),
                       file_masters=True)  # no pinned copy of what the device holds
    check_fits_host(planned.forecast, engine.device.type)  # past the host's memory: one line, before load
    reasons = list(planned.reasons) if planned.auto is not None else []
    if held and budget is not None:
        reasons.append(held)
    ram_reasons = list(planned.ram.reasons) if planned.ram else []
    lean = [c.line for c in planned.forecast.lean] if planned.forecast is not None else []
    notes = [*(f"--vram-budget: {line}" for line in reasons), *(f"--ram-budget: {line}" for line in ram_reasons),
             *(f"lean phase: {line}" for line in (lean if budget is None else ()))]  # a budget's reasons say them
    return RunPlan(planned.plan, planned.plan.policy if planned.auto is not None else plan.policy,
                   planned.auto.overhead if planned.auto is not None else None, reasons, planned.ram, lean, notes)


def _compile_asked(engine: EngineHandle, plan: Plan, request: GenerateRequest) -> tuple[str, int | None]:
    """(--compile's mode, the workspace an earlier run measured at this request's size, or None)."""
    options = getattr(engine, "options", None)
    asked = getattr(options, "compile", "off") or "off"
    if asked == "off":
        return asked, None
    backend = getattr(options, "compile_backend", "inductor") or "inductor"
    return asked, recorded_workspace(plan, request_size(request).label(), engine.device_name, backend)
