"""The `plan --json` document as pydantic models: one definition gives the output and its JSON schema.

Versioned by its `schema` field (`omni-console.plan/1`): within a version no key is removed,
renamed or changes meaning; new keys may be added. The published schema (docs/schemas/) is
generated from these models by `python -m omni_console.console.schemas`. All sizes are bytes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...offload.units import STREAMED_DESCRIPTION
from ..model_dir.roles import Role
from .plan import Residency, Why

PLAN_SCHEMA = "omni-console.plan/1"


class Document(BaseModel):
    """A JSON document the CLI prints: exact keys (a misspelt one is an error), frozen once built."""

    # a printed document always holds every key, defaulted ones (`schema`) included: the schema says so
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                              json_schema_serialization_defaults_required=True)

    def to_json_dict(self) -> dict[str, Any]:
        """The document as printed: JSON types, wire names (`schema`, `class`)."""
        return self.model_dump(mode="json", by_alias=True)


class PolicyDoc(Document):
    """The offload policy as the operator chose it (the same keys as `OffloadPolicy`)."""

    mode: Literal["dlo", "resident"]
    dlo_offload_components: dict[str, bool] = Field(description="component -> offloaded (staged); 'default' key")
    resident_layers: int = Field(ge=0, description="DiT blocks kept on the device (leading ones with placement "
                                                   "'leading', vLLM-Omni's meaning)")
    placement: Literal["leading", "spread"] = Field(
        "leading", description="which blocks stay resident: the first N, or N spread evenly between streamed ones")
    prefetch_slots: int = Field(2, ge=2, description="device slots of the streamer's ring (k): copies run up to "
                                                     "k-1 blocks ahead")
    stream_dtype: Literal["float8_e4m3fn", "float8_e5m2"] | None = Field(
        None, description="DiT weights stored in fp8 by diffusers' layerwise-casting rule (null: as the checkpoint)")
    fp8_modulation: bool = Field(False, description="AdaLN modulation linears in fp8 too (not diffusers' rule)")
    upcast_resident: Literal["auto", "off"] | int = Field(
        "auto", description="fp8 storage: resident blocks kept in the compute dtype (the first N resident ones); "
                            "auto: a --vram-budget weighs it (none without one); off: every one upcast per forward")
    stream_encoders: Literal["auto", "on", "off"] = Field(
        "auto", description="staged text encoders streamed layer by layer (auto: only where a budget needs it)")
    vae_tiling: Literal["auto", "on", "off"] = Field("auto", description="tiled VAE decode (pixels differ)")
    vae_slicing: Literal["auto", "on", "off"] = Field("auto", description="VAE decode one sample at a time")
    ff_chunking: Literal["auto", "on", "off"] = Field("auto", description="feed-forward chunked over the batch")
    lean_auto: list[str] = Field(default_factory=list, description="lean phases a --vram-budget turned on (they "
                                                                   "were auto; a new budget may turn them off)")


class ModelDoc(Document):
    path: str
    pipeline_class: str | None
    total_bytes: int = Field(ge=0)


class BlockListDoc(Document):
    """One list of repeated DiT blocks (e.g. `transformer_blocks`), in execution order."""

    attr: str
    count: int = Field(ge=0)
    bytes_per_block: list[int]
    units: list[str] = Field(default_factory=list, description=(
        "UNet blocks only: the streamed children (`resnets.0`, `attentions.0`) in call order; empty: entries by index"))
    largest_block_bytes: int = Field(ge=0)
    total_bytes: int = Field(ge=0)


class ComponentDoc(Document):
    name: str
    role: Role
    library: str | None
    class_name: str | None = Field(alias="class")
    dtypes: list[str] = Field(description="dtypes by bytes held, largest first")
    num_params: int = Field(ge=0)
    bytes: int = Field(ge=0)
    variant: str | None
    files: list[str] = Field(description="weight files, relative to the model directory")
    residency: Residency = Field(description="streamed (DiT blocks), staged (offloaded encoder/VAE), resident, none")
    why: Why = Field(description="explicit / default / implicit: the policy map's entry; dlo, mode, no-weights, "
                                 "not-auxiliary, no-blocks, unused (never called: built empty, nothing placed): "
                                 "not the map's to decide")
    device_bytes: int = Field(ge=0)
    host_bytes: int = Field(ge=0)
    block_lists: list[BlockListDoc]
    block_order: Literal["source", "observed"] | None = Field(
        None, description="DiT with several block lists: where their order comes from: 'source' (its class's "
                          "__init__, checked against the first forward of a load) or 'observed' (a real forward)")
    non_block_bytes: int | None = Field(description="DiT or UNet only: bytes outside the block lists")
    resident_layers: int | None = Field(description="DiT or UNet only: its blocks kept on the device")


class ForecastDoc(Document):
    device_resident_bytes: int = Field(ge=0)
    pinned_host_bytes: int = Field(ge=0)
    pinned_host_bytes_live_replan: int = Field(0, ge=0, description="host bytes kept by a live-re-plan load "
                                                                    "(the console's): every DiT block and encoder/VAE")
    streamed_bytes_per_forward: int = Field(ge=0, description=STREAMED_DESCRIPTION)
    peak_device_weight_bytes: int = Field(ge=0)
    largest_streamed_block_bytes: int = Field(ge=0)
    largest_staged_bytes: int = Field(ge=0)
    num_streamed_blocks: int = Field(ge=0)
    num_resident_blocks: int = Field(ge=0)
    streaming_slots: int = Field(0, ge=0, description="device slots of the streaming ring (k)")
    resident_block_indices: list[int] = Field(default_factory=list,
                                              description="resident DiT blocks, execution order (0-based)")
    placement: Literal["leading", "spread"] = "leading"
    stream_dtype: str | None = Field(None, description="fp8 dtype the DiT's weights are stored and streamed in "
                                                       "(null: the checkpoint's); byte figures above are at it")
    fp8_modulation: bool = Field(False, description="AdaLN modulation linears stored in fp8 too (not diffusers' rule)")
    upcast_scratch_bytes: int = Field(0, ge=0, description="fp8 storage: device scratch for the running block "
                                                           "upcast to the compute dtype (in the peak)")
    upcast_block_indices: list[int] = Field(
        default_factory=list, description="fp8 storage: resident blocks kept in the compute dtype, execution order "
                                          "(0-based; converted once at load, counted at its bytes, no upcast time)")
    storage_note: str | None = Field(None, description="fp8 storage: how outputs differ from the full-precision "
                                                       "pipeline")
    lora_device_bytes: int = Field(0, ge=0, description="--lora: A/B (and merge's scratch) on the device, counted in "
                                                        "device_resident_bytes and every peak")


class LeanPhaseDoc(Document):
    """One lean phase in effect: its phase's peak without and with it, its cost, whether output is exact."""

    name: Literal["stream_encoders", "vae_tiling", "vae_slicing", "ff_chunking"]
    phase: str = Field(description="text_encoding, denoise or vae_decode")
    peak_before_bytes: int | None = Field(description="the phase's peak without any lean phase (null: not modelled)")
    peak_after_bytes: int | None = Field(description="the phase's peak as planned (null: not modelled)")
    cost: str
    exact: bool = Field(description="output bit-identical to the plain pipeline's")
    line: str = Field(description="the line `plan` prints")


class HostPartDoc(Document):
    """One named share of the host peak and the phases that hold it."""

    name: str = Field(description="process baseline, pinned blocks, pinned staged masters, encoder layer "
                                  "ring arena, bounce ring, load read buffers, device weights (CPU), decoded output")
    bytes: int = Field(ge=0)
    phases: list[str] = Field(description="load, text_encoding, denoise, vae_decode")


class HostForecastDoc(Document):
    """The process's host memory (RSS, pinned pages included, the droppable page cache excluded) per phase."""

    peak_bytes: int = Field(ge=0)
    peak_phase: str = Field(description="load, text_encoding, denoise or vae_decode")
    phase_peaks: dict[str, int]
    parts: list[HostPartDoc]
    live_replan: bool = Field(description="the load keeps masters of everything a re-plan may move (the console's, "
                                          "`run`'s with --vram-budget)")
    baseline_source: Literal["default", "cached"] = Field(
        description="default: the process baseline measured on an H100 (engine/planning/host_forecast.py); "
                    "cached: learned from a request of this model (on any plan: notes say when another)")
    process_base_bytes: int = Field(0, ge=0, description="the process's own base RSS in the request's phases (the "
                                    "'process baseline' part): python, the libraries, the CUDA context's host side, "
                                    "the kernels a request loads, the heap; every other part is the plan's bytes")
    notes: list[str] = Field(default_factory=list)


class RequestForecastDoc(Document):
    """The whole request before load: device peak and step time, each with where it came from."""

    device: str = Field(description="device name the forecast is for (the profile cache key)")
    size: dict[str, int | float | None] = Field(description="height, width, frames, max_sequence_length, guidance")
    peak_bytes: int = Field(ge=0, description="the largest phase: weights on the device + that phase's extra")
    peak_phase: str = Field(description="text_encoding, denoise or vae_decode")
    size_assumed: list[str] = Field(default_factory=list, description="size fields the request left out, taken "
                                                                      "from the pipeline's defaults")
    peak_source: Literal["measured", "cached", "estimated", "unknown"] = Field(
        description="cached: measured by an earlier request of this size; estimated: scaled from another size "
                    "or estimated from the configs (peak_basis says which); unknown: weights only")
    peak_basis: str = Field("", description="what the peak's activations rest on: 'cached', 'scaled from WxH', "
                                            "'estimated from config' ('' when unknown)")
    phase_peaks: dict[str, int]
    step_seconds: float | None = Field(description="predicted denoise step (null: nothing measured yet)")
    step_floor_seconds: float | None = Field(description="max(compute, streamed bytes / link rate) per step")
    step_source: Literal["measured", "cached", "estimated", "unknown"]
    step_basis: str = Field("", description="what the step time rests on: 'cached', 'scaled from WxH', "
                                            "'estimated from config' (FLOPs / the device table's throughput)")
    bandwidth_bytes_per_s: float | None
    bandwidth_source: Literal["measured", "cached", "estimated", "unknown"]
    notes: list[str]
    process_peak_bytes: int | None = Field(None, ge=0, description="device memory of the process at the peak, as "
                                           "NVML counts it per process: peak_bytes (torch allocated) + CUDA "
                                           "context + allocator margin (null: a CPU)")
    context_bytes: int | None = Field(None, ge=0, description="the CUDA context and libraries outside the allocator")
    context_source: Literal["measured", "default", "none"] | None = Field(
        None, description="measured: NVML per process minus torch reserved on this device, driver and torch; "
                          "default: nothing measured here yet")
    lean_phases: list[LeanPhaseDoc] = Field(default_factory=list,
                                            description="lean phases in effect, each with its cost (planning/lean.py)")
    host: HostForecastDoc | None = Field(None, description="the process's host memory per phase (null: not "
                                                           "forecast)")


class AutoPlanDoc(Document):
    """`--vram-budget`: the budget and one line per decision the planner took."""

    budget_bytes: int = Field(ge=1)
    reasons: list[str]


class RamPlanDoc(Document):
    """`--ram-budget`: the host budget, where each streamed block and staged master lives, and why."""

    budget_bytes: int = Field(ge=1)
    pin_cap_bytes: int = Field(ge=0, description="page-locked bytes allowed: max(40 %, min(90 %, budget - 4 GiB))")
    fixed_host_bytes: int = Field(ge=0, description="the process and its transients, outside the planned items")
    host_peak_bytes: int = Field(ge=0, description="fixed + pinned + bounce ring: the process's RSS at its peak")
    pinned_bytes: int = Field(ge=0, description="blocks and masters kept page-locked")
    page_cache_bytes: int = Field(ge=0, description="read through the kernel's page cache (not the process's)")
    disk_bytes: int = Field(ge=0, description="read from disk with O_DIRECT")
    bounce_ring_bytes: int = Field(ge=0, description="pinned slots the page-cache and disk tiers read through")
    block_tiers: list[Literal["pinned", "page_cache", "disk"]] = Field(
        description="per DiT/UNet block in execution order (a block the host does not keep: pinned); empty: all "
                    "pinned")
    component_tiers: dict[str, Literal["pinned", "page_cache", "disk"]] = Field(
        description="per encoder/VAE master the host keeps")
    transfer_seconds_per_forward: float = Field(ge=0, description="max(link, page-cache + disk reads) per forward")
    reasons: list[str]


class VllmOmniDoc(Document):
    """The same policy in vLLM-Omni's spellings (flags empty in resident mode)."""

    flags: str
    serve: str
    python: str
    exact: bool = Field(True, description="false when the policy has choices vLLM-Omni cannot say (see gaps)")
    gaps: list[str] = Field(default_factory=list, description="one line per choice without a vLLM-Omni spelling")


class RanksDoc(Document):
    """`--gpus N` with N > 1: what one rank holds and moves (every rank the same sizes)."""

    gpus: int = Field(ge=2)
    allgather: bool = Field(description="true: each rank pins 1/N of every streamed block and all-gathers it; "
                                        "false: rank-local, every rank streams whole blocks")
    parallel: Literal["dp", "cfg"] = Field(description="dp: N replicas, N requests at once; cfg: the two guidance "
                                                       "branches of one request on two ranks")
    describe: str
    requests_at_once: int = Field(ge=1)
    pinned_host_bytes: int = Field(ge=0, description="per rank: streamed shards (or whole blocks) + staged masters")
    pinned_host_bytes_all_ranks: int = Field(ge=0, description="all ranks together (one host's memory if shared)")
    streamed_pinned_bytes: int = Field(ge=0, description="per rank: ceil(block / N) of every streamed block")
    staged_pinned_bytes: int = Field(ge=0, description="per rank: whole encoder/VAE masters (staged rank-locally)")
    padding_bytes: int = Field(ge=0, description="zero bytes that make the shards equal, all ranks together")
    shard_buffer_bytes: int = Field(ge=0, description="per rank: the two device buffers shards land in")
    device_peak_bytes: int = Field(ge=0, description="per rank: the single-GPU peak + shard buffers + slot padding")
    device_peak_source: Literal["measured", "cached", "estimated", "unknown"]
    pcie_bytes_per_forward: int = Field(ge=0, description="per rank, host->device, one DiT forward")
    nvlink_bytes_per_forward: int = Field(ge=0, description="per rank, gathered from the other ranks, one forward")
    forwards_per_step: int | None = Field(description="DiT forwards per step on a rank (null: no profile yet)")
    compute_seconds_per_step: float | None
    step_floor_seconds: float | None = Field(description="max(compute, copy + gather) per forward x forwards; "
                                                         "null: not known")
    step_floor_source: Literal["measured", "cached", "estimated", "unknown"]
    pcie_bandwidth_bytes_per_s: float | None
    nvlink_bandwidth_bytes_per_s: float | None = Field(description="the gather's rate used (an estimate)")
    gather_link: Literal["NVLink", "gloo"] = Field(description="what the gather crosses: NVLink between GPUs, "
                                                              "gloo between rank processes on a CPU")
    notes: list[str]


class MeasuredHitsDoc(Document):
    """The hit rate this family measured for the same --cache setting (the step count with the most forwards)."""

    forwards: int = Field(ge=1, description="DiT forwards the cache decided")
    hits: int = Field(ge=0, description="forwards that skipped the blocks after the probe")
    steps: int = Field(ge=0, description="the requests' step count these counts were measured at")
    hit_rate: float = Field(ge=0, le=1)
    expected_step_seconds: float | None = Field(description="the step at that rate, between the range's ends "
                                                            "(null: the uncached step is not known yet)")


class CacheRangeDoc(Document):
    """`--cache`: the step as a range (no hits down to the kind's best case), never one forecast."""

    cache: str = Field(description="the setting as given (`first-block:threshold=0.2`)")
    kind: Literal["first-block", "mag", "taylorseer", "faster", "pab", "sea"]
    is_range: Literal[True] = Field(True, description="always true: whether a step hits depends on the weights "
                                                      "and the prompt, which a plan does not see")
    no_hits_step_seconds: float | None = Field(description="the uncached step (null: not measured yet)")
    best_step_seconds: float | None = Field(description="every forward a hit: only the blocks a hit still runs "
                                                        "are copied and computed (null: not measured yet)")
    blocks_run_on_hit: int | None = Field(description="blocks a hit forward still copies and runs (0: TaylorSeer "
                                                      "lite predicts every block; null: the kind skips inside "
                                                      "blocks, every block is copied)")
    num_blocks: int = Field(ge=0, description="the DiT's blocks in execution order")
    measured: MeasuredHitsDoc | None = Field(description="a hit rate measured here for this setting (null: none)")
    line: str = Field(description="the line `plan` prints")


class LoraFileDoc(Document):
    """One checked `--lora` file."""

    path: str
    bytes: int = Field(ge=0, description="its tensors' bytes as the file holds them")
    scale: float
    components: list[str] = Field(description="the pipeline components its keys apply to")
    mode: Literal["sidecar", "merge", "auto"] = Field(description="--lora-mode as asked")


class LoraDoc(Document):
    """`--lora`'s device bytes and each mode's extra work per denoising step (engine/planning/lora_cost.py)."""

    mode: Literal["sidecar", "merge", "auto"] = Field(description="--lora-mode as asked")
    chosen: Literal["sidecar", "merge"] = Field(description="the mode applied (auto: the smaller forecast step)")
    why: str
    device_bytes: int = Field(ge=0, description="in the chosen mode: A/B, plus merge's B·A scratch")
    ab_bytes: int = Field(ge=0, description="every LoRA's A/B on the device in the compute dtype (both modes)")
    merge_scratch_bytes: int = Field(ge=0, description="merge: one B·A of the largest targeted weight")
    sidecar_flops_per_step: float | None = Field(description="the low-rank matmuls (null: the tokens are not known)")
    merge_flops_per_step: float = Field(ge=0, description="B·A of each LoRA layer in a streamed block, per arrival")
    sidecar_seconds_per_step: float | None = Field(description="null: the device's compute rate is not known")
    merge_seconds_per_step: float | None = Field(description="null: the device's compute rate is not known")
    vllm_omni: str = Field(description="vLLM-Omni's spelling of the LoRA (empty: none)")
    vllm_omni_gaps: list[str] = Field(default_factory=list, description="what vLLM-Omni cannot express, one line each")


class PlanDocument(Document):
    """`omni-console plan --json`: components, residency, forecast and vLLM-Omni flags, before any load."""

    model_config = ConfigDict(title="omni-console plan document")

    schema_id: Literal["omni-console.plan/1"] = Field(PLAN_SCHEMA, alias="schema")
    model: ModelDoc
    policy: PolicyDoc
    components: list[ComponentDoc]
    forecast: ForecastDoc
    vllm_omni: VllmOmniDoc
    notes: list[str] = Field(description="files discovery ignored on purpose (code, pickles), one line each")
    request_forecast: RequestForecastDoc | None = Field(None, description="peak and step time of a request")
    auto_plan: AutoPlanDoc | None = Field(None, description="present with --vram-budget")
    ram_plan: RamPlanDoc | None = Field(None, description="present with --ram-budget")
    ranks: RanksDoc | None = Field(None, description="present with --gpus N, N > 1")
    cache: CacheRangeDoc | None = Field(None, description="present with --cache (not off): the step as a range")
    loras: list[LoraFileDoc] | None = Field(None, description="present with --lora: each file")
    lora: LoraDoc | None = Field(None, description="present with --lora: bytes and cost per step of each mode")
