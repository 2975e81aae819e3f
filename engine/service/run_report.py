"""The `run --json` report as pydantic models: one definition gives the output and its JSON schema.

Versioned by its `schema` field (`omni-console.run-report/1`): within a version no key is removed,
renamed or changes meaning; new keys may be added. The published schema (docs/schemas/) is
generated from these models by `python -m omni_console.console.schemas`. Sizes are bytes, times
seconds; a reading this machine cannot make (no CUDA, no NVML) is null.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from ...offload.units import COPIED_DESCRIPTION, STREAMED_DESCRIPTION
from ..planning.documents import Document, PolicyDoc

RUN_REPORT_SCHEMA = "omni-console.run-report/1"


class ForecastSummary(Document):
    """The plan's forecast for the policy the run used (the full forecast is in `plan --json`)."""

    peak_device_weight_bytes: int = Field(ge=0)
    pinned_host_bytes: int = Field(ge=0)
    streamed_bytes_per_forward: int = Field(ge=0, description=STREAMED_DESCRIPTION)
    host_pinned_bytes: int = Field(0, ge=0, description="the host forecast's pinned share of this load (pinned "
                                   "blocks, pinned staged masters, a layer ring's arena, bounce rings): what "
                                   "pinned_bytes measures on CUDA; run --vram-budget keeps no pinned master of what "
                                   "the device holds, so it is pinned_host_bytes (the streamed blocks and staged "
                                   "masters) plus any ring")


class StepReport(Document):
    step: int
    wall_s: float = Field(description="wall time of the denoise step")
    stall_s: float = Field(description="time compute waited on weight transfers in the step")
    h2d_bytes: int = Field(ge=0, description="bytes copied to the device (host copies on a CPU) in the step: "
                           "copied_bytes_per_forward for each forward that streamed")
    cache_forwards: int = Field(0, ge=0, description="--cache: DiT forwards whose step cache decided in the step")
    cache_hits: int = Field(0, ge=0, description="... of which the cache skipped the blocks after its probe block")
    skipped_bytes: int = Field(0, ge=0, description="bytes of the streamed blocks the cache skipped: never copied")


class CacheReport(Document):
    """`--cache`: diffusers' step cache the request ran with and what it saved the link."""

    cache: str = Field(description="the --cache setting (kind and parameters)")
    forwards: int = Field(ge=0, description="DiT forwards whose cache decided whether the later blocks run "
                          "(0: a kind that skips no whole blocks, e.g. pab, taylorseer)")
    hits: int = Field(ge=0, description="forwards that skipped the blocks after the probe block")
    hit_rate: float | None = Field(description="hits / forwards; null when no forward decided")
    bytes_skipped: int = Field(ge=0, description="bytes of streamed blocks the cache skipped: never copied")
    bytes_moved: int = Field(ge=0, description="bytes copied to the device over the request's steps")


class StagingTotals(Document):
    h2d_transfers: int = Field(ge=0)
    h2d_bytes: int = Field(ge=0)
    h2d_seconds: float
    h2d_bytes_per_s: float | None = Field(description="mean host->device bandwidth; null without transfers")
    sync_transfers: int = Field(ge=0)
    by_target_kind: dict[str, int] = Field(description="transfers by target: block (streamed DiT) / component")


class CacheDecisionReport(Document):
    action: Literal["retain", "release"]
    reason: str
    forced: bool


class TelemetryPeaks(Document):
    samples: int = Field(ge=0)
    torch_reserved_peak: int | None
    nvml_used_peak: int | None
    host_rss_peak: int | None
    pinned_peak: int | None
    final: list[str] = Field(description="the last telemetry sample as report lines")


class ForecastCheckReport(Document):
    """The forecast made before the request vs what it measured (errors as (predicted - measured) / measured)."""

    predicted_peak_bytes: int | None
    measured_peak_bytes: int | None
    peak_error: float | None
    peak_source: str = Field(description="cached / estimated / unknown (no prediction)")
    predicted_step_s: float | None
    measured_step_s: float | None = Field(description="median step after the first (on a CPU the fastest "
                                          "after the first, as the profile takes it)")
    step_error: float | None
    step_source: str
    peak_basis: str = Field("", description="what the predicted peak rested on: cached, 'scaled from WxH', "
                                            "'estimated from config'")
    step_basis: str = Field("", description="what the predicted step rested on (as peak_basis)")


class AutoPlanReport(Document):
    budget_bytes: int = Field(ge=1)
    reasons: list[str] = Field(description="one line per decision --vram-budget took")


class RamPlanReport(Document):
    budget_bytes: int = Field(ge=1)
    pin_cap_bytes: int = Field(ge=0, description="page-locked bytes allowed under the budget")
    host_peak_bytes: int = Field(ge=0, description="the tier plan's host peak: fixed + pinned + bounce ring")
    page_cache_bytes: int = Field(ge=0, description="read through the kernel's page cache")
    disk_bytes: int = Field(ge=0, description="read from disk with O_DIRECT")
    block_tiers: list[Literal["pinned", "page_cache", "disk"]] = Field(
        default_factory=list, description="per DiT/UNet block in execution order, as loaded; empty: all pinned")
    component_tiers: dict[str, Literal["pinned", "page_cache", "disk"]] = Field(
        default_factory=dict, description="per staged encoder/VAE: pinned master, or read from its files at each stage")
    reasons: list[str] = Field(description="one line per decision --ram-budget took")


class OomStepDownReport(Document):
    """A phase that ran out of device memory and was retried once at a lower policy."""

    phase: str = Field(description="text_encoding, denoise or vae_decode")
    component: str
    action: str = Field(description="what was stepped down (resident blocks, the ring, a staged component)")
    message: str = Field(description="the out-of-memory error's first line")


class CompileReport(Document):
    """`--compile`: the request's regional compile and Dynamo's counts (engine/running/request_compile.py)."""

    on: bool = Field(description="the request ran with its repeated blocks compiled")
    why: str = Field(description="why on or off (auto: the device, the forecast's payback)")
    expect: str | None = Field(None, description="cold, warm (Inductor's cache), in memory (compiled earlier in this "
                                                 "process), or null when off")
    seconds: float = Field(ge=0, description="wall seconds Dynamo spent compiling during the request (measured)")
    forecast_seconds: float = Field(ge=0, description="the compile seconds the plan expected")
    compiles: int = Field(ge=0, description="frames Dynamo compiled during the request")
    recompiles: int = Field(ge=0, description="of which recompiles (a frame compiled again: a guard failed)")
    graph_breaks: int = Field(ge=0, description="Dynamo's graph breaks (0 with fullgraph)")
    workspace_bytes: int | None = Field(None, ge=0, description="the compile's device workspace measured in this "
                                        "request: the compiling first step's allocator peak above the later "
                                        "steps'; null where not measured (no compile in it, one step, or no CUDA)")


class RunReport(Document):
    """`omni-console run --json`: what the load and the request cost, and what was written."""

    model_config = ConfigDict(title="omni-console run report")

    schema_id: Literal["omni-console.run-report/1"] = Field(RUN_REPORT_SCHEMA, alias="schema")
    model: str = Field(description="model directory")
    device: str
    policy: PolicyDoc
    forecast: ForecastSummary
    load_seconds: float
    load_phases: dict[str, float] = Field(default_factory=dict, description="seconds: read (from the start until "
                                          "every byte was read), arrange (the rest: device copies, stagers, hooks), "
                                          "register (time in cudaHostRegister, alongside the reads)")
    load_milestones: dict[str, float] = Field(default_factory=dict, description="seconds from the load's start "
                                              "when each part was done: dits_built, dit_blocks_read (the last "
                                              "block byte read), dits_placed (blocks read into their arena and "
                                              "page-locked), others_built (encoders, VAEs), pipeline_built")
    pinned_bytes: int = Field(ge=0, description="pinned host memory held after the load")
    host_master_bytes: int = Field(0, ge=0, description="host bytes held for weights after the load, page-locked "
                                   "or not (a CPU locks nothing): the block arena, the bounce ring, the stagers' "
                                   "masters")
    pin_fallback_blocks: int = Field(0, ge=0, description="streamed blocks the host refused to page-lock, read "
                                     "from the page cache instead (0: every block it was asked to lock)")
    pin_fallback_bytes: int = Field(0, ge=0, description="their weight bytes")
    copied_bytes_per_forward: int = Field(0, ge=0, description=COPIED_DESCRIPTION)
    request_seconds: float
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None = Field(None, description="torch's caching allocator: its reserved peak over "
                                            "the request (allocated + cache + fragmentation; null off CUDA)")
    steps: list[StepReport]
    cache: CacheReport | None = Field(None, description="--cache's step cache and its hit rate; null: no cache")
    output: str | None = Field(description="--output when something was written, else null")
    files: list[str] = Field(description="every file written (several for frames written as images)")
    frames: int = Field(ge=0)
    rendered_size: list[int] | None = Field(None, description="[width, height] of the frames as the pipeline "
                                            "rendered them (what was written)")
    guidance: float | None = Field(None, description="the guidance scale the request ran with: --guidance, else "
                                   "the pipeline call's default or its guider component's (null: it takes none)")
    is_video: bool
    fps: float | None = Field(description="frame rate written (videos only)")
    fps_source: Literal["--fps", "pipeline", "default"] | None
    latent_shape: list[int] | None
    forecast_check: ForecastCheckReport | None = Field(None, description="predicted vs measured peak and step")
    auto_plan: AutoPlanReport | None = Field(None, description="present with --vram-budget")
    ram_plan: RamPlanReport | None = Field(None, description="present with --ram-budget")
    lean_phases: list[str] = Field(default_factory=list, description="lean phases in effect (tiled or sliced VAE "
                                   "decode, streamed text encoders, chunked feed-forward), each with its peak, "
                                   "its cost and whether the output stays bit-identical")
    phases: dict[str, float] = Field(description="seconds by phase: text_encoding, denoise, vae_decode")
    vae_decode_peak_bytes: int | None
    notes: list[str]
    staging: StagingTotals
    cache_decisions: list[CacheDecisionReport] = Field(description="the most recent allocator-cache decisions")
    cache_decisions_total: int = Field(ge=0)
    cache_releases: int = Field(ge=0)
    log: list[str] = Field(description="the most recent engine log lines")
    log_lines_total: int = Field(ge=0)
    events_dropped: int = Field(ge=0, description="events the report missed (totals are then partial)")
    telemetry: TelemetryPeaks
    process_peak_bytes: int | None = Field(None, description="device memory of the process at its peak, as NVML "
                                           "counts it per process: the larger of its samples from load to the "
                                           "request's end and the CUDA context + torch's reserved peak (a floor "
                                           "the 50 ms samples can miss); null: not measurable (the note says why)")
    process_peak_sampled_bytes: int | None = Field(None, description="the largest of NVML's per-process samples "
                                                   "(every 50 ms)")
    process_peak_note: str | None = None
    allocator_cap_bytes: int | None = Field(None, description="--vram-budget: the caching allocator's cap "
                                            "(budget minus the CUDA context)")
    context_bytes: int | None = Field(None, description="NVML per process minus torch reserved at the end "
                                      "(cached for the next plan)")
    predicted_process_peak_bytes: int | None = Field(None, description="the forecast's device memory of the "
                                                     "process: its allocated peak + CUDA context + margin")
    process_peak_error: float | None = Field(None, description="(predicted - measured) / measured, NVML per process")
    context_source: Literal["measured", "default", "none"] | None = None
    host_peak_bytes: int | None = Field(None, description="the process's measured peak RSS (VmHWM, load and "
                                        "request; pinned pages included, the page cache excluded); null: not "
                                        "measurable here")
    predicted_host_peak_bytes: int | None = Field(None, description="the host forecast's peak (plan --json's "
                                                  "request_forecast.host.peak_bytes)")
    host_peak_error: float | None = Field(None, description="(predicted - measured) / measured, host peak RSS")
    host_process_base_bytes: int | None = Field(None, ge=0, description="the host forecast's process base RSS: "
                                                "python, the libraries, the CUDA context's host side and the heap, "
                                                "the one term of predicted_host_peak_bytes that is not the plan's "
                                                "bytes (learned from a request once one ran)")
    host_forecast_source: Literal["default", "cached", ""] = Field(
        "", description="the host forecast's baseline: default (a measured constant) or cached (learned from a "
                        "request of this model and plan); '' without a forecast")
    oom_step_downs: list[OomStepDownReport] = Field(default_factory=list, description="phases that ran out of "
                                                    "memory, stepped down and were retried once")
    compile: CompileReport | None = Field(None, description="--compile regional|auto: the compile phase and "
                                         "Dynamo's counts; null with --compile off")


def rendered_size_notes(asked_width: int | None, asked_height: int | None, rendered: list[int] | None) -> list[str]:
    """A note when the frames written are not the size asked (a pipeline whose VAE upsamples by another
    factor than the pipeline assumes, as a tiny Kandinsky 5 does): never another size without a word."""
    if asked_width is None or asked_height is None or rendered is None or rendered == [asked_width, asked_height]:
        return []
    return [f"the pipeline rendered {rendered[0]}x{rendered[1]}, not the {asked_width}x{asked_height} asked "
            "(written as rendered)"]
