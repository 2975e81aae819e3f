"""The run report of one served request, built by the engine from what the request returned and what its
face measured around it (event totals, device memory, the last telemetry lines): one builder, so every
face reports the same request the same way. Validated against `RunReport` (the published schema) as built.
"""

from __future__ import annotations

import json
from typing import Any

from ..running.pipeline_output import frame_size
from ..running.profiler import request_size
from ..running.run_memory import step_down_docs
from .outputs import Written, frames_of
from .run_report import RunReport
from .service import Ticket


def check_doc(check: Any) -> dict[str, Any] | None:
    """The forecast made before the request vs what it measured."""
    if check is None:
        return None
    return {"predicted_peak_bytes": check.predicted_peak, "measured_peak_bytes": check.measured_peak,
            "peak_error": check.peak_error, "peak_source": check.peak_source,
            "predicted_step_s": check.predicted_step_s, "measured_step_s": check.measured_step_s,
            "step_error": check.step_error, "step_source": check.step_source,
            "peak_basis": getattr(check, "peak_basis", ""), "step_basis": getattr(check, "step_basis", "")}


def host_check_doc(check: Any) -> dict[str, Any]:
    """The report's host keys from the engine's `ForecastCheck` (empty without one)."""
    if check is None:
        return {}
    return {"host_peak_bytes": check.measured_host_peak, "predicted_host_peak_bytes": check.predicted_host_peak,
            "host_peak_error": check.host_error, "host_forecast_source": check.host_source,
            "host_process_base_bytes": getattr(check, "predicted_host_base", None)}


def host_pinned_bytes(plan: Any, budget: int | None, ram: Any) -> int:
    """The host forecast's pinned share of `plan` as `run` loads it (live re-plan masters under a budget without
    `--ram-budget`: engine/plan_flow.loads_live; their tiers are in `plan.tiers`)."""
    from ..plan_flow import loads_live
    from ..planning.host_forecast import PINNED_PARTS, host_forecast

    forecast = host_forecast(plan, live_replan=loads_live(budget, 1 if ram is not None else None))
    return sum(forecast.part(name) for name in PINNED_PARTS)


def ram_doc(ram: Any) -> dict[str, Any] | None:
    """`--ram-budget`'s answer (engine/planning/ram_plan.RamPlan) as the report holds it (None without one)."""
    if ram is None:
        return None
    c = ram.choice
    return {"budget_bytes": c.budget, "pin_cap_bytes": c.pin_cap, "host_peak_bytes": c.cost.host_peak_bytes,
            "page_cache_bytes": c.cost.page_cache_bytes, "disk_bytes": c.cost.disk_bytes,
            "block_tiers": list(ram.tiers.blocks), "component_tiers": dict(ram.tiers.components),
            "reasons": list(ram.reasons)}


def cache_doc(spec: Any, steps: Any) -> dict[str, Any] | None:
    """The request's step cache: its setting, hit rate, bytes skipped and moved (None: no cache)."""
    if spec is None:
        return None
    forwards, hits = sum(s.cache_forwards for s in steps), sum(s.cache_hits for s in steps)
    return {"cache": spec.text(), "forwards": forwards, "hits": hits,
            "hit_rate": hits / forwards if forwards else None,
            "bytes_skipped": sum(s.skipped_bytes for s in steps), "bytes_moved": sum(s.h2d_bytes for s in steps)}


def run_report(*, model: str, device: str, policy: Any, plan: Any, load: Any, result: Any, ticket: Ticket,
               written: Written, memory: dict[str, Any], totals: dict[str, Any], telemetry: dict[str, Any],
               events_dropped: int, budget: int | None = None, reasons: list[str] | None = None, ram: Any = None,
               lean: list[str] | None = None) -> dict[str, Any]:
    """The report's JSON document. `policy`: the one loaded; `memory`: the device-memory fields
    (`RunMemory.finish` and `predicted`); `totals`: the event totals' summary (`RunTotals.summary`);
    `telemetry`: their peaks and the last sample's lines; `budget`/`reasons`: `--vram-budget` and its
    decisions; `ram`: `--ram-budget`'s answer; `lean`: the lean phases in effect."""
    frames = frames_of(result)
    f = plan.forecast
    return RunReport.model_validate({
        "model": model, "device": device, "policy": json.loads(policy.model_dump_json()),
        "forecast": {"peak_device_weight_bytes": f.peak_device_weight_bytes, "pinned_host_bytes": f.pinned_host_bytes,
                     "streamed_bytes_per_forward": f.streamed_bytes_per_forward,
                     "host_pinned_bytes": host_pinned_bytes(plan, budget, ram)},
        "load_seconds": load.seconds, "load_phases": dict(load.phases), "load_milestones": dict(load.milestones),
        "pinned_bytes": load.pinned_bytes, "host_master_bytes": getattr(load, "host_master_bytes", 0),
        "copied_bytes_per_forward": load.streamed_copy_bytes,
        "pin_fallback_blocks": load.pin_fallback_blocks, "pin_fallback_bytes": load.pin_fallback_bytes,
        "request_seconds": result.seconds, "peak_allocated_bytes": result.peak_allocated_bytes,
        "peak_reserved_bytes": result.peak_reserved_bytes,
        "steps": [{"step": s.step, "wall_s": s.wall_s, "stall_s": s.stall_s, "h2d_bytes": s.h2d_bytes,
                   "cache_forwards": s.cache_forwards, "cache_hits": s.cache_hits, "skipped_bytes": s.skipped_bytes}
                  for s in result.steps],
        "cache": cache_doc(ticket.run.request.cache, result.steps),
        "output": str(ticket.run.output.path) if written.files else None,
        "files": [str(p) for p in written.files],
        "frames": len(frames),
        "rendered_size": frame_size(frames[0]) if frames else None,
        "guidance": result.guidance,
        "is_video": written.video, "fps": written.fps, "fps_source": written.fps_source,
        "latent_shape": list(result.latent_shape) if result.latent_shape is not None else None,
        "phases": dict(result.phases),
        "vae_decode_peak_bytes": result.vae_decode_peak_bytes,
        "forecast_check": check_doc(result.check),
        "auto_plan": {"budget_bytes": budget, "reasons": list(reasons or [])} if budget is not None else None,
        "ram_plan": ram_doc(ram),
        **memory,
        "oom_step_downs": step_down_docs(result),
        **host_check_doc(result.check),
        "lean_phases": list(lean or []),
        "compile": result.compile.as_dict() if getattr(result, "compile", None) is not None else None,
        "notes": written.notes,
        **totals,
        "events_dropped": events_dropped,
        "telemetry": telemetry,
    }).to_json_dict()


def served_report(engine: Any, ticket: Ticket, outcome: Any, *, load: Any, memory: dict[str, Any],
                  totals: dict[str, Any], telemetry: dict[str, Any], events_dropped: int) -> dict[str, Any] | None:
    """`run_report` for a face whose request the service ran on a loaded engine (the console): the policy and
    plan the engine carries out, and the lean phases its forecast of the request applies, read here on the
    engine thread (a face's UI thread never reads them). None when nothing was run or written."""
    plan = engine.plan
    if plan is None or outcome.result is None or outcome.written is None:
        return None
    forecast = engine.forecast(request_size(ticket.request), plan=plan)
    return run_report(model=str(engine.model.path), device=str(engine.device), policy=plan.policy, plan=plan,
                      load=load, result=outcome.result, ticket=ticket, written=outcome.written, memory=memory,
                      totals=totals, telemetry=telemetry, events_dropped=events_dropped,
                      lean=[c.line for c in forecast.lean] if forecast is not None else [])
