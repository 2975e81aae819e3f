"""Planning: a plan for a policy, its budgets, forecasts and documents (one way to a forecast: `plan_for`).

One namespace of the engine's front door (`from omni_console.engine.api import planner`); names load lazily.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports are this namespace's names, for type checkers)
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:  # the same names as `EXPORTS` (tests/engine/test_api.py holds them equal)
    from ...offload.policy import DEFAULT_KEY, LEAN_FIELDS, LEAN_MODES, build_policy, parse_components_json
    from ...offload.tiers import TIERS, HostTiers, Tier
    from ..model_dir.fp8_names import storage_note
    from ..plan_flow import PlanResult, loads_live, plan_for
    from ..planning.auto_budget import auto_budget
    from ..planning.compile_plan import compile_document, plan_compile
    from ..planning.device_footprint import DeviceOverhead, device_overhead, record_context
    from ..planning.documents import Document, PlanDocument, PolicyDoc
    from ..planning.experts import blocks_per_forward
    from ..planning.export import plan_to_dict, vllm_flags, vllm_gaps, vllm_python_call, vllm_serve_command
    from ..planning.host_forecast import HostForecast
    from ..planning.lora_export import vllm_lora
    from ..planning.model_configs import default_size
    from ..planning.plan import ComponentPlan, make_plan
    from ..planning.ram_budget import auto_ram_budget
    from ..planning.ram_plan import RamPlan
    from ..planning.request_profile import device_name_for_plan
    from ..ranks.rank_checks import check_rank_devices
    from ..ranks.rank_forecast import RankForecast
    from ..ranks.rank_layout import rank_layout
    from ..running.cache_hits import measured_hits
    from ..running.cache_range import cache_step_range

EXPORTS: dict[str, tuple[str, ...]] = {
    "..running.cache_range": ("cache_step_range",),
    "..running.cache_hits": ("measured_hits",),
    "..plan_flow": ("PlanResult", "loads_live", "plan_for"),
    "..planning.plan": ("ComponentPlan", "make_plan"),
    "..planning.host_forecast": ("HostForecast",),
    "..planning.ram_plan": ("RamPlan",),
    "..ranks.rank_forecast": ("RankForecast",),
    "...offload.tiers": ("HostTiers", "TIERS", "Tier"),
    "..planning.auto_budget": ("auto_budget",),
    "..planning.compile_plan": ("compile_document", "plan_compile"),
    "..planning.ram_budget": ("auto_ram_budget",),
    "..planning.model_configs": ("default_size",),
    "..planning.experts": ("blocks_per_forward",),
    "..planning.lora_export": ("vllm_lora",),
    "..model_dir.fp8_names": ("storage_note",),
    "..planning.request_profile": ("device_name_for_plan",),
    "..planning.documents": ("Document", "PlanDocument", "PolicyDoc"),
    "..planning.export": ("plan_to_dict", "vllm_flags", "vllm_gaps", "vllm_python_call", "vllm_serve_command"),
    "...offload.policy": ("DEFAULT_KEY", "LEAN_FIELDS", "LEAN_MODES", "build_policy", "parse_components_json"),
    "..ranks.rank_layout": ("rank_layout",),
    "..ranks.rank_checks": ("check_rank_devices",),
    "..planning.device_footprint": ("DeviceOverhead", "device_overhead", "record_context"),
}
"""Each name's module (relative to this package)."""

__getattr__, __dir__, __all__ = lazy_names(__name__, __package__, EXPORTS)
