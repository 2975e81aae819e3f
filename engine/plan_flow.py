"""`plan_for`: the one home of plan → `--vram-budget` auto plan → forecast → per-rank figures, and the one
way to a request forecast (`Engine.forecast` asks it too).

`plan`, `run` (one GPU and `--gpus`), the console's start and its budget dialog all plan through
here, each for its own request size (the caller's: `plan`'s flags, `run`'s checked request, the
console's current size or the pipeline's defaults), so the sequence cannot drift between them.
Torch-free, like `plan`: nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .errors import ConfigError
from .model_dir.discovery import ModelInfo
from .planning.auto_plan import AutoPlan, auto_plan_for
from .planning.lora_cost import LoraModes, LoraModule, lora_modes, with_lora
from .planning.model_configs import fill_size
from .planning.plan import Plan, make_plan
from .planning.ram_flow import ram_plan_for
from .planning.ram_plan import RamPlan
from .planning.request_forecast import RequestForecast, forecast_for
from .planning.request_profile import RequestSize
from .planning.run_masters import masters_in_files

if TYPE_CHECKING:
    from ..offload.policy import OffloadPolicy
    from .handle import EngineHandle
    from .planning.device_footprint import DeviceOverhead
    from .ranks.rank_forecast import RankForecast
    from .ranks.rank_layout import RankLayout


@dataclass(frozen=True)
class PlanResult:
    """A plan and what was decided and forecast for it. `auto`: the budget's answer (None without one)."""

    plan: Plan
    forecast: RequestForecast | None
    reasons: list[str] = field(default_factory=list)
    ranks: RankForecast | None = None
    auto: AutoPlan | None = None
    ram: RamPlan | None = None  # `--ram-budget`'s host tiers (engine/planning/ram_plan.py), None without one
    lora: LoraModes | None = None  # --lora: its device bytes (in the plan) and each mode's cost per step

    @property
    def overhead(self) -> DeviceOverhead | None:
        """The process's device memory outside torch's allocated bytes, as the budget counted it."""
        return self.auto.overhead if self.auto is not None else None


def loads_live(budget: int | None, ram_budget: int | None) -> bool:
    """Whether `run` loads with live re-plan masters: under a `--vram-budget` (an out-of-memory step-down can then
    move resident blocks), unless a `--ram-budget` plans the host, which cannot hold a master of everything."""
    return budget is not None and ram_budget is None


def plan_for(model_or_engine: ModelInfo | EngineHandle, policy: OffloadPolicy | Plan, budget: int | None = None,
             size: RequestSize | None = None, device: str | None = None, layout: RankLayout | None = None, *,
             bandwidth: float | None = None, forecast: bool = True, ram_budget: int | None = None,
             live: bool | None = None, observed_bandwidth: float | None = None,
             probe_bandwidth: float | None = None, file_masters: bool = False,
             lora_modules: Sequence[LoraModule] = (), lora_mode: str = "auto") -> PlanResult:
    """Plan `policy` for the model (an engine plans with its own model and device name); a `Plan` made
    already is taken as it is. With `budget`, the auto-planner's choice replaces it (`NothingFits`:
    exit 2), `bandwidth` (bytes/s) the link rate it assumes, else the profile's. `forecast`: also
    forecast the chosen plan at `size` on `device`, and with a distributed `layout` per rank.
    `live`: whether the load keeps live re-plan masters; None: as `run` loads (`loads_live`).
    `observed_bandwidth` / `probe_bandwidth`: the link rates a loaded engine has seen or measured
    (`Engine.forecast` passes them; `forecast_for` says which rate wins). `file_masters` (`run`): a live load's
    masters of what lives on the device are its files, not pinned (engine/planning/run_masters.py).
    `lora_modules` (each checked `--lora` file's layers): their device bytes are counted in the plan before the
    budget plans (`lora_cost.with_lora`), and `lora_mode` "auto" resolves to the mode with the smaller step.
    A distributed `layout` is checked against the pipeline first (`check_parallel`)."""
    engine = None if isinstance(model_or_engine, ModelInfo) else model_or_engine
    live = loads_live(budget, ram_budget) if live is None else live
    if isinstance(policy, Plan):
        plan = policy
    elif engine is not None:
        plan = engine.make_plan(policy)
    else:
        assert isinstance(model_or_engine, ModelInfo)
        plan = make_plan(model_or_engine, policy)
    distributed = layout is not None and layout.distributed
    if distributed:
        from .ranks.rank_checks import check_parallel

        assert layout is not None
        check_parallel(layout, plan.model.pipeline_class)
    if device is None:
        if engine is None:
            raise TypeError("plan_for: a model needs the device's name (an engine knows its own)")
        device = engine.device_name
    size = size if size is not None else RequestSize()
    lora = None
    if lora_modules:  # the A/B (and merge's scratch) take their device room before any budget plans
        lora = lora_modes(plan, lora_modules, fill_size(plan.model, size), device, lora_mode)
        plan = with_lora(plan, lora.device_bytes(lora.chosen))
    auto = None
    if budget is not None:
        auto = auto_plan_for(plan, budget, size, device, bandwidth)
        plan = auto.plan
        if lora is not None:  # the figures for the blocks the budget streams, in the mode already counted
            final = lora_modes(plan, lora_modules, fill_size(plan.model, size), device, lora.chosen)
            lora = replace(final, why=lora.why)
    ram = None
    if ram_budget is not None and distributed:
        raise ConfigError("--ram-budget with --gpus: the ranks share the host's memory, which the host plan does not "
                          "split yet; leave it out")
    if ram_budget is not None:  # after the device plan: it decides what the host keeps
        plan, ram = ram_plan_for(plan, ram_budget, size, device, live, bandwidth)
    if file_masters and live and not distributed:
        plan = masters_in_files(plan)
    if not forecast:
        return PlanResult(plan, None, list(auto.reasons) if auto else [], None, auto, ram, lora)
    # the host as the load will hold it
    request = forecast_for(plan, size, device, observed_bandwidth, probe_bandwidth, live_replan=live,
                           tier_transfer_s=ram.choice.cost.transfer_seconds if ram is not None else None)
    if budget is not None:  # the run caps the allocator inside the budget (engine/running/run_memory.py)
        request = replace(request, budget=budget)
    ranks = None
    if distributed:
        from .ranks.rank_forecast import rank_forecast_for

        assert layout is not None
        ranks = rank_forecast_for(plan, layout, request, size, device)
    return PlanResult(plan, request, list(auto.reasons) if auto else [], ranks, auto, ram, lora)
