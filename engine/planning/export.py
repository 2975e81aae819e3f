"""The chosen policy in vLLM-Omni's own spellings, and as a stable JSON document."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from ..model_dir.discovery import ComponentInfo
from ..model_dir.fp8_names import storage_note
from ..model_dir.roles import DENOISER_ROLES
from .documents import (
    PLAN_SCHEMA,
    AutoPlanDoc,
    BlockListDoc,
    CacheRangeDoc,
    ComponentDoc,
    ForecastDoc,
    HostForecastDoc,
    HostPartDoc,
    LeanPhaseDoc,
    ModelDoc,
    PlanDocument,
    PolicyDoc,
    RamPlanDoc,
    RanksDoc,
    RequestForecastDoc,
    VllmOmniDoc,
)
from .host_forecast import HostForecast
from .lean import LABELS
from .lora_cost import LoraModes
from .lora_export import lora_doc, lora_file_docs
from .plan import ComponentPlan, Plan
from .ram_plan import RamPlan
from .request_forecast import RequestForecast

if TYPE_CHECKING:  # types only: a plan's document names the rank layout it was made for (ranks sit above planning)
    from ..ranks.rank_forecast import RankForecast
    from ..ranks.rank_layout import RankLayout

__all__ = ["PLAN_SCHEMA", "plan_document", "plan_to_dict", "ranks_doc", "vllm_flags", "vllm_gaps", "vllm_python_call",
           "vllm_serve_command"]


def vllm_flags(plan: Plan) -> str:
    """`--dlo-offload-components '…' --dlo-resident-layers N`, or the no-offload note for resident mode."""
    policy = plan.policy
    if policy.mode == "resident":
        return ""
    return (f"--dlo-offload-components {shlex.quote(policy.components_json())} "
            f"--dlo-resident-layers {policy.resident_layers}")


def vllm_gaps(plan: Plan, layout: RankLayout | None = None) -> list[str]:
    """What the policy chose that vLLM-Omni cannot say; the flags keep the closest spelling."""
    policy, residency = plan.policy, plan.residency
    if policy.mode == "resident":
        return []
    gaps = [_unet_gap(c) for c in plan.components if c.info.role == "unet" and c.residency == "streamed"]
    if layout is not None and layout.sharded and policy.resident_layers > 0:
        gaps.append("vLLM-Omni rejects resident layers with AllGather (its resident blocks come from a TP-aware "
                    "loader); here resident blocks are whole on every rank")
    if layout is not None and layout.distributed and layout.parallel == "cfg":
        gaps.append("CFG-parallel ranks have no spelling here: the line shows the data-parallel equivalent")
    if not residency.is_leading:
        gaps.append(f"placement 'spread' has no vLLM-Omni spelling: --dlo-resident-layers {policy.resident_layers} "
                    f"keeps the leading {policy.resident_layers} blocks resident instead of blocks "
                    f"{_index_ranges(residency.resident_indices)}")
    if residency.slots > 2:
        gaps.append(f"a {residency.slots}-slot prefetch ring has no vLLM-Omni spelling: vLLM-Omni prefetches one "
                    f"block ahead (2 slots)")
    lean = [LABELS[n] for n in LABELS if policy.lean_on(n)]
    if lean:
        gaps.append(f"{', '.join(lean)}: no vLLM-Omni spelling (its pipelines run the plain phases)")
    if policy.stream_dtype is not None:
        gaps.append(f"--stream-dtype {policy.stream_dtype} has no vLLM-Omni spelling: its DLO streams the blocks "
                    f"in the checkpoint's dtype")
    if residency.num_upcast:
        gaps.append(f"{residency.num_upcast} resident blocks kept upcast (--upcast-resident) have no vLLM-Omni "
                    "spelling")
    return gaps


def _unet_gap(c: ComponentPlan) -> str:
    blocks = c.info.block_lists
    lists = f"{sum(b.count for b in blocks)} units in {len(blocks)} down/mid/up blocks"
    return (f"vLLM-Omni's layerwise offload streams a DiT's blocks only: it has no spelling for streaming the UNet "
            f"{c.info.name!r} ({lists}), so its flags are the closest spelling, not an equivalent "
            "(--dlo-resident-layers counts DiT blocks there)")


def _index_ranges(indices: tuple[int, ...]) -> str:
    """0,1,2,5,7,8 -> '0-2,5,7-8'."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def vllm_serve_command(plan: Plan, layout: RankLayout | None = None) -> str:
    """The equivalent `vllm serve` line: one GPU, or N data-parallel ranks; AllGather only when sharded
    (on one GPU vLLM-Omni streams rank-locally, which resident layers require there)."""
    path = shlex.quote(str(plan.model.path))
    ranks = f" --data-parallel-size {layout.gpus}" if layout is not None and layout.distributed else ""
    if plan.policy.mode == "resident":
        return f"vllm serve {path} --omni{ranks}"
    gather = "--dlo-use-allgather" if layout is not None and layout.sharded else "--dlo-no-use-allgather"
    return f"vllm serve {path} --omni{ranks} --enable-distributed-layerwise-offload {gather} {vllm_flags(plan)}"


def vllm_python_call(plan: Plan, layout: RankLayout | None = None) -> str:
    """The equivalent `Omni(...)` constructor call."""
    ranks = f", data_parallel_size={layout.gpus}" if layout is not None and layout.distributed else ""
    if plan.policy.mode == "resident":
        return f"Omni(model={str(plan.model.path)!r}{ranks})"
    comps = ", ".join(f"{k!r}: {v!r}" for k, v in plan.policy.dlo_offload_components.items())
    gather = layout is not None and layout.sharded
    return (f"Omni(model={str(plan.model.path)!r}{ranks}, enable_distributed_layerwise_offload=True, "
            f"dlo_use_allgather={gather}, dlo_resident_layers={plan.policy.resident_layers}, "
            f"dlo_offload_components={{{comps}}})")


def request_forecast_doc(forecast: RequestForecast, device: str) -> RequestForecastDoc:
    return RequestForecastDoc(
        device=device, size=forecast.size.model_dump(), size_assumed=list(forecast.assumed),
        peak_bytes=forecast.peak_bytes, peak_phase=forecast.peak_phase, peak_source=forecast.peak_source,
        peak_basis=forecast.peak_basis, phase_peaks=dict(forecast.phase_peaks), step_seconds=forecast.step_s,
        step_floor_seconds=forecast.floor_s, step_source=forecast.step_source, step_basis=forecast.step_basis,
        bandwidth_bytes_per_s=forecast.bandwidth, bandwidth_source=forecast.bandwidth_source,
        notes=list(forecast.notes),
        lean_phases=[LeanPhaseDoc(name=c.name, phase=c.phase, peak_before_bytes=c.peak_before,  # type: ignore[arg-type]
                                  peak_after_bytes=c.peak_after, cost=c.cost, exact=c.exact, line=c.line)
                     for c in forecast.lean], host=host_doc(forecast.host), **_footprint(forecast))


def host_doc(host: HostForecast | None) -> HostForecastDoc | None:
    if host is None:
        return None
    return HostForecastDoc(peak_bytes=host.peak_bytes, peak_phase=host.peak_phase, phase_peaks=dict(host.phase_peaks),
                           parts=[HostPartDoc(name=p.name, bytes=p.nbytes, phases=list(p.phases)) for p in host.parts],
                           live_replan=host.live_replan, baseline_source=host.baseline_source,  # type: ignore[arg-type]
                           process_base_bytes=host.part("process baseline"), notes=list(host.notes))


def _footprint(forecast: RequestForecast) -> dict[str, object]:
    overhead = forecast.overhead
    if overhead is None or overhead.context_source == "none":
        return {}
    return {"process_peak_bytes": forecast.process_peak_bytes, "context_bytes": overhead.context_bytes,
            "context_source": overhead.context_source}


def ranks_doc(ranks: RankForecast) -> RanksDoc:
    layout = ranks.layout
    return RanksDoc(
        gpus=layout.gpus, allgather=layout.allgather, parallel=layout.parallel, describe=ranks.describe,
        requests_at_once=ranks.requests_at_once, pinned_host_bytes=ranks.pinned_host_bytes,
        pinned_host_bytes_all_ranks=ranks.pinned_host_bytes_all_ranks,
        streamed_pinned_bytes=ranks.streamed_pinned_bytes, staged_pinned_bytes=ranks.staged_pinned_bytes,
        padding_bytes=ranks.padding_bytes, shard_buffer_bytes=ranks.shard_buffer_bytes,
        device_peak_bytes=ranks.device_peak_bytes, device_peak_source=ranks.device_peak_source,
        pcie_bytes_per_forward=ranks.pcie_bytes_per_forward, nvlink_bytes_per_forward=ranks.nvlink_bytes_per_forward,
        forwards_per_step=ranks.forwards_per_step, compute_seconds_per_step=ranks.compute_s_per_step,
        step_floor_seconds=ranks.step_floor_s, step_floor_source=ranks.step_floor_source,
        pcie_bandwidth_bytes_per_s=ranks.pcie_bandwidth, nvlink_bandwidth_bytes_per_s=ranks.nvlink_bandwidth,
        gather_link=ranks.gather_link,
        notes=list(ranks.notes))


def plan_document(plan: Plan, forecast: RequestForecast | None = None, device: str = "",
                  budget: int | None = None, reasons: list[str] | None = None,
                  ranks: RankForecast | None = None, ram: RamPlan | None = None,
                  cache: CacheRangeDoc | None = None, *, loras: Sequence[Any] = (), lora: LoraModes | None = None,
                  lora_mode: str = "auto") -> PlanDocument:
    """The `plan --json` document (schema `omni-console.plan/1`; the fields are described in planning/documents.py)."""
    request, forecast = forecast, plan.forecast
    layout = ranks.layout if ranks is not None else None
    return PlanDocument(
        model=ModelDoc(path=str(plan.model.path), pipeline_class=plan.model.pipeline_class,
                       total_bytes=plan.model.nbytes),
        policy=PolicyDoc(mode=plan.policy.mode, dlo_offload_components=dict(plan.policy.dlo_offload_components),
                         resident_layers=plan.policy.resident_layers, placement=plan.policy.placement,
                         prefetch_slots=plan.policy.prefetch_slots, stream_dtype=plan.policy.stream_dtype,
                         fp8_modulation=plan.policy.fp8_modulation, upcast_resident=plan.policy.upcast_resident,
                         stream_encoders=plan.policy.stream_encoders,
                         vae_tiling=plan.policy.vae_tiling, vae_slicing=plan.policy.vae_slicing,
                         ff_chunking=plan.policy.ff_chunking, lean_auto=list(plan.policy.lean_auto)),
        components=[
            ComponentDoc(
                name=c.info.name, role=c.info.role, library=c.info.library,
                class_name=c.info.class_name, dtypes=c.info.dtypes, num_params=c.info.num_params,
                bytes=c.info.nbytes, variant=c.info.variant,
                files=[str(f.relative_to(plan.model.path)) for f in c.info.files],
                residency=c.residency, why=c.why,
                device_bytes=c.device_bytes, host_bytes=c.host_bytes,
                block_lists=[
                    BlockListDoc(attr=b.attr, count=b.count, bytes_per_block=list(b.block_bytes), units=list(b.items),
                                 largest_block_bytes=b.largest_bytes, total_bytes=b.total_bytes)
                    for b in c.info.block_lists
                ],
                block_order=block_order(c.info),
                non_block_bytes=c.info.non_block_bytes if c.info.role in DENOISER_ROLES else None,
                resident_layers=c.resident_layers if c.info.role in DENOISER_ROLES else None,
            )
            for c in plan.components
        ],
        forecast=ForecastDoc(
            device_resident_bytes=forecast.device_resident_bytes,
            pinned_host_bytes=forecast.pinned_host_bytes,
            pinned_host_bytes_live_replan=forecast.pinned_host_bytes_live,
            streamed_bytes_per_forward=forecast.streamed_bytes_per_forward,
            peak_device_weight_bytes=forecast.peak_device_weight_bytes,
            largest_streamed_block_bytes=forecast.largest_streamed_block_bytes,
            largest_staged_bytes=forecast.largest_staged_bytes,
            num_streamed_blocks=forecast.num_streamed_blocks,
            num_resident_blocks=forecast.num_resident_blocks,
            streaming_slots=forecast.streaming_slots,
            resident_block_indices=list(plan.residency.resident_indices),
            placement=plan.residency.placement,
            stream_dtype=plan.stream_dtype, fp8_modulation=plan.policy.fp8_modulation,
            upcast_scratch_bytes=forecast.upcast_scratch_bytes, lora_device_bytes=forecast.lora_device_bytes,
            upcast_block_indices=[i for i, u in enumerate(plan.residency.upcast_flags) if u],
            storage_note=storage_note(plan.stream_dtype, plan.policy.fp8_modulation, plan.model.block_kind),
        ),
        vllm_omni=VllmOmniDoc(flags=vllm_flags(plan), serve=vllm_serve_command(plan, layout),
                              python=vllm_python_call(plan, layout), exact=not vllm_gaps(plan, layout),
                              gaps=vllm_gaps(plan, layout)),
        notes=list(plan.model.notes),
        request_forecast=request_forecast_doc(request, device) if request is not None else None,
        auto_plan=AutoPlanDoc(budget_bytes=budget, reasons=list(reasons or [])) if budget is not None else None,
        ram_plan=ram_plan_doc(ram) if ram is not None else None,
        ranks=ranks_doc(ranks) if ranks is not None and ranks.layout.distributed else None,
        cache=cache,
        loras=lora_file_docs(loras, lora_mode) if loras else None,
        lora=lora_doc(loras, lora, lora_mode) if lora is not None else None,
    )


def ram_plan_doc(ram: RamPlan) -> RamPlanDoc:
    """`--ram-budget`'s answer as the document holds it."""
    c = ram.choice
    return RamPlanDoc(budget_bytes=c.budget, pin_cap_bytes=c.pin_cap, fixed_host_bytes=c.fixed,
                      host_peak_bytes=c.cost.host_peak_bytes, pinned_bytes=c.cost.pinned_bytes,
                      page_cache_bytes=c.cost.page_cache_bytes, disk_bytes=c.cost.disk_bytes,
                      bounce_ring_bytes=c.cost.ring_bytes, block_tiers=list(ram.tiers.blocks),
                      component_tiers=dict(ram.tiers.components),
                      transfer_seconds_per_forward=c.cost.transfer_seconds, reasons=list(ram.reasons))


def block_order(info: ComponentInfo) -> Literal["source", "observed"] | None:
    """Where a DiT's block-list order comes from (None: fewer than two lists, nothing to order)."""
    if info.role != "dit" or len(info.block_lists) < 2:
        return None
    return "observed" if info.order_observed else "source"


def plan_to_dict(plan: Plan, forecast: RequestForecast | None = None, device: str = "",
                 budget: int | None = None, reasons: list[str] | None = None,
                 ranks: RankForecast | None = None, ram: RamPlan | None = None,
                 cache: CacheRangeDoc | None = None, *, loras: Sequence[Any] = (), lora: LoraModes | None = None,
                 lora_mode: str = "auto") -> dict[str, Any]:
    """The `plan --json` document as printed (JSON types, keys as in the schema); `cache`: --cache's step range
    (engine/running/cache_range.py); `loras`: the checked `--lora` files, `lora` their figures (`PlanResult.lora`)."""
    return plan_document(plan, forecast, device, budget, reasons, ranks, ram, cache, loras=loras, lora=lora,
                         lora_mode=lora_mode).to_json_dict()
