"""The engine's front door: everything the console uses of the engine (and, through it, of the
offload layer) is named here, and the console imports nothing else below it but `engine.events`,
`engine.errors` and `offload.units` (an import-linter contract in pyproject.toml holds it).

`EngineHandle` is what the console drives, `Engine` (one GPU, in process) or `GroupEngine` (a rank
group); `open_engine` makes either; `plan_for` is the one plan → budget → forecast sequence.

Names load lazily (PEP 562): `plan` and the console's first frame must not import torch, and most
of what is named here does. `from omni_console.engine.api import X` imports only X's module.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports below are the names this module exports, for type checkers)
from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names as `_EXPORTS`, for type checkers (tests/engine/test_api.py holds them equal)
    from ..offload.nvml_source import NvmlSource, nvml_target_for
    from ..offload.policy import (
        DEFAULT_KEY,
        LEAN_FIELDS,
        LEAN_MODES,
        OffloadPolicy,
        build_policy,
        parse_components_json,
    )
    from ..offload.process_memory import ProcessPeakMeter, bound_allocator, context_bytes
    from ..offload.telemetry import TelemetrySampler, default_sources, validate_hz
    from ..offload.telemetry_types import DEFAULT_HZ, HostMemory, NvmlMemory, Source, TelemetrySnapshot, TorchMemory
    from ..offload.tiers import TIERS, HostTiers, Tier
    from .demo.demo_model import DEMO_GENERATION, build_demo_model, ensure_demo_model, is_demo_model
    from .device_probes import DeviceInfo, import_runtime, measure_h2d_bandwidth, read_device_info
    from .engine import Engine, default_device
    from .handle import EngineHandle
    from .lifecycle import EngineState, EngineStateError
    from .loading.bus_error import install_bus_error_line
    from .loading.device_choice import parse_device
    from .loading.loader import LoadCancelled, pipeline_class, pipeline_init_values
    from .loading.lora_files import check_loras
    from .model_dir.call_source import makes_still_images
    from .model_dir.discovery import ModelInfo, discover_model
    from .model_dir.fp8_names import storage_note
    from .model_dir.weights import load_json
    from .options import EngineOptions
    from .plain_text import plain, plain_lines
    from .plan_flow import PlanResult, loads_live, plan_for
    from .planning.auto_budget import auto_budget
    from .planning.device_footprint import DeviceOverhead, device_overhead, record_context
    from .planning.documents import Document, PlanDocument, PolicyDoc
    from .planning.experts import blocks_per_forward
    from .planning.export import plan_to_dict, vllm_flags, vllm_gaps, vllm_python_call, vllm_serve_command
    from .planning.host_forecast import HostForecast
    from .planning.model_configs import default_size
    from .planning.plan import ComponentPlan, Plan, make_plan
    from .planning.ram_budget import auto_ram_budget
    from .planning.ram_plan import RamPlan
    from .planning.request_forecast import RequestForecast
    from .planning.request_profile import RequestSize, device_name_for_plan
    from .ranks.group_engine import GroupEngine
    from .ranks.rank_checks import check_rank_devices
    from .ranks.rank_forecast import RankForecast
    from .ranks.rank_group import RankFailed
    from .ranks.rank_layout import RankLayout, rank_layout
    from .results import GenerateResult, LoadReport
    from .running.atomic_write import publish_new, remove_pending, scratch_folder
    from .running.cache_hits import measured_hits
    from .running.cache_range import cache_step_range
    from .running.cache_spec import CacheSpec, parse_cache
    from .running.call_options import (
        accepted_options,
        call_signature,
        check_call,
        check_shape,
        frames_rule,
        option_parameter,
    )
    from .running.group_write import GroupOutput, write_results
    from .running.host_fit import check_fits_host
    from .running.outputs import DEFAULT_FPS, OutputTarget, check_output, check_output_place, write_notes, write_result
    from .running.param_syntax import check_finite, check_parameter_names, parse_param
    from .running.pipeline_output import frame_size
    from .running.profiler import request_size
    from .running.request_checks import SEED_MAX, check_request
    from .running.request_limits import check_limits, schedule_steps
    from .running.run_memory import RunMemory, prefer_expandable_segments, step_down_docs
    from .running.runner import GenerateRequest, RequestCancelled, total_steps_of
    from .running.signal_guard import (
        SignalGuard,
        SignalStop,
        completed_outputs,
        deferrable,
        forget_outputs,
        held,
        pause_point,
    )
    from .running.step_cache import check_cache_support
    from .running.text_length import check_text_length
    from .service import request_events
    from .service.checks import CheckedRun, check_model_request, check_run
    from .service.history import History, HistoryEntry
    from .service.outputs import Written, frames_of, write_outputs
    from .service.report import run_report, served_report
    from .service.run_report import RunReport
    from .service.run_totals import RunTotals
    from .service.service import Outcome, RequestService, Ticket, request_of
    from .worker import EngineWorker

_EXPORTS: dict[str, tuple[str, ...]] = {
    # the engine, its handle, options and states
    ".engine": ("Engine", "default_device"),
    ".ranks.group_engine": ("GroupEngine",),
    ".handle": ("EngineHandle",),
    ".lifecycle": ("EngineState", "EngineStateError"),
    ".options": ("EngineOptions",),
    ".results": ("GenerateResult", "LoadReport"),
    ".worker": ("EngineWorker",),
    # the request service: checks, queue, runs, writes and remembers requests
    ".service.service": ("Outcome", "RequestService", "Ticket", "request_of"),
    ".service": ("request_events",),  # the service's typed events, as one namespace (wt-queue)
    ".service.checks": ("CheckedRun", "check_model_request", "check_run"),
    ".service.history": ("History", "HistoryEntry"),
    ".service.outputs": ("Written", "frames_of", "write_outputs"),
    ".service.report": ("run_report", "served_report"),
    ".service.run_report": ("RunReport",),
    ".service.run_totals": ("RunTotals",),
    ".loading.loader": ("LoadCancelled", "pipeline_class", "pipeline_init_values"),
    ".loading.lora_files": ("check_loras",),
    # device probes: what a face asks of the machine (no console module imports torch)
    ".device_probes": ("DeviceInfo", "import_runtime", "measure_h2d_bandwidth", "read_device_info"),
    ".running.run_memory": ("RunMemory", "prefer_expandable_segments", "step_down_docs"),
    # the model directory
    ".model_dir.discovery": ("ModelInfo", "discover_model"),
    ".model_dir.weights": ("load_json",),
    ".model_dir.call_source": ("makes_still_images",),
    ".demo.demo_model": ("DEMO_GENERATION", "build_demo_model", "ensure_demo_model", "is_demo_model"),
    # planning and forecasting
    ".plan_flow": ("PlanResult", "loads_live", "plan_for"),
    ".planning.plan": ("ComponentPlan", "Plan", "make_plan"),
    ".planning.request_forecast": ("RequestForecast",),
    ".planning.host_forecast": ("HostForecast",),
    "..offload.tiers": ("TIERS", "HostTiers", "Tier"),
    ".planning.request_profile": ("RequestSize", "device_name_for_plan"),
    ".running.profiler": ("request_size",),
    ".planning.experts": ("blocks_per_forward",),
    ".planning.model_configs": ("default_size",),
    ".model_dir.fp8_names": ("storage_note",),
    ".planning.auto_budget": ("auto_budget",),
    ".planning.ram_budget": ("auto_ram_budget",),
    ".planning.ram_plan": ("RamPlan",),
    ".planning.device_footprint": ("DeviceOverhead", "device_overhead", "record_context"),
    ".planning.export": ("plan_to_dict", "vllm_flags", "vllm_gaps", "vllm_python_call", "vllm_serve_command"),
    ".planning.documents": ("Document", "PlanDocument", "PolicyDoc"),
    # ranks
    ".ranks.rank_layout": ("RankLayout", "rank_layout"),
    ".ranks.rank_checks": ("check_rank_devices",),
    ".ranks.rank_forecast": ("RankForecast",),
    ".ranks.rank_group": ("RankFailed",),
    # requests and their outputs
    ".running.runner": ("GenerateRequest", "RequestCancelled", "total_steps_of"),
    ".running.call_options": (
        "accepted_options",
        "call_signature",
        "check_call",
        "check_shape",
        "frames_rule",
        "option_parameter",
    ),
    ".running.param_syntax": ("check_finite", "check_parameter_names", "parse_param"),
    ".running.cache_spec": ("CacheSpec", "parse_cache"),  # --cache's text, torch-free
    ".running.step_cache": ("check_cache_support",),
    ".running.cache_range": ("cache_step_range",),
    ".running.cache_hits": ("measured_hits",),
    ".running.host_fit": ("check_fits_host",),
    ".running.request_checks": ("SEED_MAX", "check_request"),
    ".running.request_limits": ("check_limits", "schedule_steps"),
    ".running.text_length": ("check_text_length",),
    ".loading.device_choice": ("parse_device",),
    ".running.outputs": (
        "DEFAULT_FPS",
        "OutputTarget",
        "check_output",
        "check_output_place",
        "write_notes",
        "write_result",
    ),
    ".running.group_write": ("GroupOutput", "write_results"),
    ".running.pipeline_output": ("frame_size",),
    ".running.atomic_write": ("publish_new", "remove_pending", "scratch_folder"),
    ".running.signal_guard": ("SignalGuard", "SignalStop", "completed_outputs", "deferrable", "forget_outputs", "held",
                               "pause_point"),
    ".loading.bus_error": ("install_bus_error_line",),
    ".plain_text": ("plain", "plain_lines"),
    # the offload layer's policy and telemetry
    "..offload.policy": (
        "DEFAULT_KEY",
        "LEAN_FIELDS",
        "LEAN_MODES",
        "OffloadPolicy",
        "build_policy",
        "parse_components_json",
    ),
    "..offload.telemetry": ("TelemetrySampler", "default_sources", "validate_hz"),
    "..offload.telemetry_types": (
        "DEFAULT_HZ", "HostMemory", "NvmlMemory", "Source", "TelemetrySnapshot", "TorchMemory",
    ),
    "..offload.nvml_source": ("NvmlSource", "nvml_target_for"),
    "..offload.process_memory": ("ProcessPeakMeter", "bound_allocator", "context_bytes"),
}
"""Each exported name's module (relative to `omni_console.engine`)."""

_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted([*_WHERE, "open_engine"])


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # looked up each time, never cached here: a name patched in its own module is the one served
    return getattr(importlib.import_module(module, __package__), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


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
