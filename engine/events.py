"""The engine's and a request's events: its state, load progress, steps, re-plans, expert switches and
forecast checks. They travel on the offload layer's `EventBus` beside its own (staging, cache,
telemetry, log and error events), which defines the `Event` base; those are re-exported here, so the
console takes every event from this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..offload.events import (  # the offload layer's own events, re-exported: the console imports events from here
    BlocksSkipped,
    BlockTiming,
    CacheDecision,
    ErrorEvent,
    Event,
    EventBus,
    LogEvent,
    OomRetry,
    StagingEvent,
    Subscription,
    TelemetryEvent,
)

if TYPE_CHECKING:
    from .planning.plan import Plan

__all__ = [
    "BlockOrderCorrected",
    "BlocksSkipped",
    "BlockTiming",
    "CompilePhase",
    "CacheDecision",
    "ErrorEvent",
    "Event",
    "EventBus",
    "LogEvent",
    "OomRetry",
    "StagingEvent",
    "Subscription",
    "TelemetryEvent",
    "EngineStateChanged",
    "ExpertPrefetch",
    "ExpertSwitched",
    "ForecastCheck",
    "LoadProgress",
    "LorasApplied",
    "OomStepDown",
    "PlanReady",
    "Replanned",
    "RequestFinished",
    "ResidencySnapshot",
    "RequestPhases",
    "RequestStarted",
    "StepTiming",
    "StepPreview",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStateChanged(Event):
    old: str
    new: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadProgress(Event):
    """Bytes of one component placed so far (host pinning or device placement)."""

    component: str
    done_bytes: int
    total_bytes: int
    phase: str = "load"


@dataclass(frozen=True, slots=True, kw_only=True)
class OomStepDown(Event):
    """A request's phase ran out of device memory: the cache was released, the policy stepped down
    (`action`: fewer resident blocks, a smaller ring, a leaner phase) and that phase's call retried once."""

    request_id: int
    phase: str  # text_encoding, denoise or vae_decode
    component: str  # whose call ran out (e.g. transformer, text_encoder_2, vae)
    action: str
    message: str = ""  # the first line of the out-of-memory error


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTiming(Event):
    """One denoise step: wall time and the time compute waited on weight transfers.

    `sync_fetches`: DiT blocks the streamer had to copy synchronously (the ring's order missed them;
    after the first step of a request, with the order checked against the first forward: 0)."""

    request_id: int
    step: int
    total_steps: int
    wall_s: float
    stall_s: float
    h2d_bytes: int = 0
    sync_fetches: int = 0
    cache_forwards: int = 0  # --cache: DiT forwards whose cache decided this step (cond and uncond count apart)
    cache_hits: int = 0  # ... of which the cache skipped the blocks after its probe block
    skipped_blocks: int = 0  # streamed blocks the cache skipped: no copy issued for them
    skipped_bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestStarted(Event):
    request_id: int
    prompt: str
    steps: int
    height: int
    width: int
    seed: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFinished(Event):
    request_id: int
    seconds: float
    ok: bool
    error: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestPhases(Event):
    """Where a finished request's time went, published once after it ends.

    `phases` holds seconds per measured phase: "text_encoding" (call start to the first DiT forward),
    "denoise" (first DiT forward to the last step end), "vae_decode" (the VAE's decode calls); a phase
    that did not run is absent. `latent_shape` is the shape of the latents the VAE decoded (else of the
    step-end latents); `vae_decode_peak_bytes` the device allocator's peak during decode (CUDA only).
    """

    request_id: int
    frames: int
    latent_shape: tuple[int, ...] | None
    phases: dict[str, float]
    vae_decode_peak_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Replanned(Event):
    """A live re-plan between requests: what moved and how long it took (no disk was read).

    `copied_bytes`: weights copied host→device (blocks and components made resident);
    `freed_bytes`: device weights released (made streamed or staged; their masters stay pinned);
    `ring_bytes`: the streaming ring's warm-up copies; `seconds`: wall time, synchronized."""

    summary: str
    copied_bytes: int
    freed_bytes: int
    ring_bytes: int
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ResidencySnapshot(Event):
    """Where each loaded component's weights are now, read by the engine on its own thread (the UI
    never touches engine objects): `rows` of (name, state, bytes), state one of resident, device,
    host, idle_expert; published when they change (load, staging, re-plan, expert switch, a DiT's
    forward) and empty on unload."""

    rows: tuple[tuple[str, str, int], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanReady(Event):
    """The plan the engine now carries out, and what a request dialog needs of the loaded pipeline, so
    the UI never reads the engine's `plan` or `pipe`: published before the engine turns ready with a
    plan it has not announced (after a load; after a request whose first forward corrected the block
    order) and after each live re-plan. `plan` holds the policy and its forecast (`Plan.forecast`).

    `steps`: the pipeline's default `num_inference_steps` (None where its call has none);
    `height`/`width`: its default size from its config (`default_sample_size` × the VAE's scale), None
    where the pipeline decides at call time or lives in other processes (a rank group)."""

    plan: Plan
    steps: int | None = None
    height: int | None = None
    width: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LorasApplied(Event):
    """The engine applied a LoRA set (at load, on a switch between requests, after a live re-plan): `loras` (path,
    scale) as applied, `mode` as asked (`--lora-mode`), `chosen` the mode it applied them in (`auto` resolved by
    the forecast step for this set and plan, which a switch or a re-plan may change; None: no LoRA applied).
    A face shows `chosen` as the mode the current and next requests run with."""

    loras: tuple[tuple[str, float], ...]
    mode: str
    chosen: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockOrderCorrected(Event):
    """A DiT's first forward ran its block lists in another order than the plan's (read from source):
    the streamer, the plan and the profile follow the observed order from then on (and it is cached,
    so later plans of this model show it). `planned` / `observed`: the block lists, in each order."""

    dit: str
    planned: tuple[str, ...]
    observed: tuple[str, ...]
    summary: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertSwitched(Event):
    """Two experts share the device budget (Wan 2.2 A14B): one expert's resident blocks were released and
    the other's placed, from their masters (pinned, or read from their files in the page-cache or disk tier).

    `reason`: "boundary" (the pipeline called the other expert: diffusers' boundary step) or "request end"
    (back to the first expert, so every request starts as the load left it). `timestep`: the timestep of
    the forward that triggered it (None at the request's end). `copied_bytes`: the new expert's resident
    blocks copied host→device; `freed_bytes`: the old expert's released; `ring_bytes`: the ring's warm-up
    copies; `seconds`: wall time, synchronized; `prefetched_bytes`: the new expert's first blocks in a file
    tier whose reads had begun before it (`ExpertPrefetch`), so the switch did not wait for them."""

    request_id: int | None
    from_expert: str
    to_expert: str
    reason: str
    timestep: float | None
    copied_bytes: int
    freed_bytes: int
    ring_bytes: int
    seconds: float
    prefetched_bytes: int = 0  # the new expert's first file-tier blocks already read (or being read) when it began


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertPrefetch(Event):
    """The running expert's last forward before a switch began (its step's last, the next timestep is the
    other expert's, or the request's last before the first expert is put back): the next expert's first
    blocks in the page-cache or disk tier are read into the bounce ring while it computes, so the switch
    does not wait for those reads. `timestep`: the forward's; `nbytes`: the blocks being read ahead."""

    request_id: int | None
    to_expert: str
    timestep: float | None
    blocks: int
    nbytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ForecastCheck(Event):
    """Predicted vs measured after a request: device peak (bytes) and median step time (seconds).

    A prediction is None when nothing could predict it (no profile of this model on this device
    yet); a measurement is None where the device cannot report it (peak on a CPU). `*_source` says
    where the prediction came from: cached, estimated or unknown."""

    request_id: int
    predicted_peak: int | None
    measured_peak: int | None
    peak_source: str
    predicted_step_s: float | None
    measured_step_s: float | None
    step_source: str
    peak_basis: str = ""  # the prediction's basis: "cached", "scaled from 64x64", "estimated from config"
    step_basis: str = ""
    predicted_slack: int | None = None  # the allocator's reserved-above-allocated the forecast counted (cached)
    # the process's host memory: forecast (engine/planning/host_forecast.py) vs measured peak RSS (VmHWM)
    predicted_host_peak: int | None = None
    measured_host_peak: int | None = None
    host_source: str = ""  # the forecast's baseline: "default" (a measured constant) or "cached" (learned)
    predicted_host_base: int | None = None  # the host forecast's process base RSS (its own term, not the plan's)

    @staticmethod
    def error(predicted: float | None, measured: float | None) -> float | None:
        """(predicted - measured) / measured, or None."""
        if predicted is None or not measured:
            return None
        return (predicted - measured) / measured

    @property
    def peak_error(self) -> float | None:
        return self.error(self.predicted_peak, self.measured_peak)

    @property
    def step_error(self) -> float | None:
        return self.error(self.predicted_step_s, self.measured_step_s)

    @property
    def host_error(self) -> float | None:
        return self.error(self.predicted_host_peak, self.measured_host_peak)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepPreview(Event):
    """One denoise step's latent, small, for the console's step preview (engine/running/step_preview.py).

    `latent`: a float32 numpy array (channels, h, w), the first item's (a video's middle frame), average-pooled
    to at most 64 a side; the console maps it to RGB with `factors` (one (R, G, B) row per channel) and
    `bias`, the published latent→RGB table of `latent_format`. `rgb`: instead, the picture a
    `--preview-decoder` decoded, uint8 (h, w, 3) (`latent_format` then names the decoder's file). Both None:
    no preview for this request, `note` says why (one such event per request)."""

    request_id: int
    step: int
    total_steps: int
    latent: Any = None
    factors: tuple[tuple[float, float, float], ...] = ()
    bias: tuple[float, float, float] = (0.0, 0.0, 0.0)
    latent_format: str = ""
    note: str = ""
    rgb: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CompilePhase(Event):
    """A request's regional compile (`--compile`), published once after it ends: whether it ran compiled and
    why, the compile seconds (measured; `forecast_seconds` what the plan expected), and Dynamo's counts.
    `expect`: "cold", "warm" (Inductor's cache), "in memory" (compiled earlier in this process) or None (off)."""

    request_id: int
    on: bool
    why: str
    expect: str | None
    seconds: float
    forecast_seconds: float
    compiles: int
    recompiles: int
    graph_breaks: int
    workspace_bytes: int | None = None  # the compile's device workspace measured in this request (None: not)
