"""What a load and a request give back: `LoadReport`, `GenerateResult` (its own module: engine.py stays small)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .events import ForecastCheck, OomStepDown, StepTiming
from .running.audio_track import AudioTrack
from .running.runner import RunOutput


@dataclass(frozen=True, slots=True)
class LoadReport:
    seconds: float
    pinned_bytes: int
    streamed_bytes: int
    device_allocated_bytes: int | None
    phases: dict[str, float] = field(default_factory=dict)
    streamed_copy_bytes: int = 0  # streamed_bytes + the packed regions' alignment padding: copied per forward
    block_host_bytes: int = 0  # the block arena: every streamed block, or this rank's shards (AllGather)
    components: dict[str, float] = field(default_factory=dict)  # seconds building each component
    dit_read_seconds: float = 0.0  # parallel reads straight into place (the block arena and what materialized)
    milestones: dict[str, float] = field(default_factory=dict)  # seconds from the start: dits_built, dits_placed, ...
    pin_fallback_blocks: int = 0  # streamed blocks the host refused to page-lock, read from the page cache instead
    pin_fallback_bytes: int = 0  # their weight bytes (`offload.pin_fallback`)
    host_master_bytes: int = 0  # host bytes kept for weights after the load: block arena, bounce ring, stagers' masters
    ranks: tuple[LoadReport, ...] = ()  # a rank group's load: each rank's own report, by rank (`run --gpus` rows)
    """Where the load's time went. `read`: seconds from the start until every byte was read (the
    components built, the blocks in their arena); `arrange`: the rest (device copies, stagers,
    hooks, the last registrations); `register`: seconds spent in `cudaHostRegister`, summed over
    the registering threads that run alongside the reads, so the three add up to more than `seconds`."""


@dataclass(frozen=True, slots=True)
class GenerateResult:
    request_id: int
    image: Any
    seconds: float
    steps: list[StepTiming] = field(default_factory=list)
    peak_allocated_bytes: int | None = None
    frames: list[Any] = field(default_factory=list)  # every frame of the first batch item (PIL, or arrays for "np")
    is_video: bool = False
    fps: float | None = None  # call_options.default_fps(model): the pipeline's own frame rate, if it has one
    latent_shape: tuple[int, ...] | None = None  # of the denoised latents the VAE decoded
    phases: dict[str, float] = field(default_factory=dict)  # seconds: text_encoding, denoise, vae_decode
    vae_decode_peak_bytes: int | None = None  # device allocator peak during VAE decode (CUDA), else None
    check: ForecastCheck | None = None  # the forecast made before the request vs what it measured
    rank_results: tuple[GenerateResult, ...] = ()  # data-parallel ranks 1…N−1 (engine.ranks.group_engine), by seed
    ranks: tuple[GenerateResult, ...] = ()  # a rank group's request: each rank's own result, by rank (CFG too)
    cancelled: bool = False  # cancel was asked before the pipeline returned (even during the VAE decode): not a result
    oom_step_downs: tuple[OomStepDown, ...] = ()  # phases that ran out of memory, stepped down and retried
    peak_reserved_bytes: int | None = None  # the caching allocator's reserved peak over the request (CUDA): NVML's
    # per-process figure is the CUDA context + this, so it bounds the process's peak from below exactly
    audio: AudioTrack | None = None  # the first item's waveform, for a pipeline that returns audio (LTX-2)
    guidance: float | None = None  # the guidance scale it ran with: --guidance, the call's default or its guider's
    compile: Any = None  # --compile: the request's CompileOutcome (engine/running/request_compile.py), None when off


def run_peak(run: RunOutput, peak_since_last_reset: int | None) -> int | None:
    """The request's device peak: text encoding, the first step and the VAE decode each reset the peak stats,
    so combine every part."""
    if peak_since_last_reset is None:
        return None
    return max(run.text_peak or 0, run.first_step_peak or 0, run.peak_before_decode or 0, peak_since_last_reset)
