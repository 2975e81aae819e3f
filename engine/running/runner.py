"""Run one generation on a placed pipeline, timing every denoise step and the request's phases.

A step is timed from the first DiT forward of that step (a forward pre-hook) to its end as the pipeline
signals it (`step_signal`: `callback_on_step_end`, an older `callback`, or the progress bar), with the compute
stream synchronized at both ends so the wall time is the device's, not the host's enqueue time (the copy stream
runs on: see `sync_compute`). The streamer's exposed stall and H2D bytes are taken at the same boundary.
Cancellation sets the pipeline's interrupt flag at the next step end.

The request maps onto the pipeline's own parameter names (`frames` -> `num_frames`, the image file
-> a PIL image, ...); the result keeps every frame of the first batch item, and where the time went
(`request_phases`: text encoding, denoise, VAE decode).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...offload.events import EventBus
from ...offload.module_hooks import Hooks
from ...offload.streamer import LayerwiseStreamer
from ..errors import ConfigError
from ..events import StepTiming
from .audio_track import AudioTrack, check_audio, first_item_audio
from .cache_spec import CacheSpec
from .guider_guidance import guidance_used, guided, pipe_takes_guider_guidance
from .pipeline_defaults import default_steps
from .pipeline_output import check_frames, first_item_frames
from .prediction_maps import map_kind, prediction_frames
from .request_phases import DecodeMeter, phase_seconds, sync, sync_compute
from .step_cache import start_cache
from .step_preview import step_previewer
from .step_signal import attach_step_end

# Request fields the engine maps onto a pipeline's own parameter names, in the order tried.
FRAME_PARAMETERS = ("num_frames", "video_length", "frames")  # Latte: video_length; SanaVideo: frames
IMAGE_PARAMETERS = ("image",)


def pipeline_parameter(accepted: Mapping[str, Any], names: tuple[str, ...]) -> str | None:
    """The first of `names` the pipeline's `__call__` takes (None: it takes none of them)."""
    return next((name for name in names if name in accepted), None)


def load_condition_image(path: Path, mode: str = "RGB") -> Any:
    """The conditioning image as PIL `mode`, fully read (the file is closed before the call)."""
    from PIL import Image

    with Image.open(path) as opened:
        return opened.convert(mode)


def condition_image_mode(pipe: Any) -> str:
    """RGBA for a pipeline whose VAE encodes four channels (Qwen-Image-Layered's RGBA VAE: an RGB image would
    fail in its first convolution, after load), else RGB."""
    config = getattr(getattr(pipe, "vae", None), "config", None)
    channels = getattr(config, "input_channels", None) or getattr(config, "in_channels", None)
    return "RGBA" if channels == 4 else "RGB"


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One generation. Fields left None are not sent: the pipeline's own default applies."""

    prompt: str
    steps: int | None = None
    height: int | None = None
    width: int | None = None
    seed: int = 0
    guidance: float | None = None
    frames: int | None = None  # -> the pipeline's num_frames
    negative_prompt: str | None = None
    max_sequence_length: int | None = None
    image: Path | None = None  # conditioning image file, opened with PIL at request time
    params: dict[str, Any] = field(default_factory=dict)  # --param KEY=VALUE, already typed; merged last
    output_type: str = "pil"  # "np" for exactness tests
    extra: dict[str, Any] = field(default_factory=dict)  # built-in defaults (demo); params win
    cache: CacheSpec | None = None  # --cache: diffusers' step cache for this request (None: off)
    loras: tuple[tuple[str, float], ...] | None = None  # its LoRA set, applied before it runs (None: as loaded)

    def explicit_kwargs(self, accepted: Mapping[str, Any]) -> dict[str, Any]:
        """The pipeline keyword for each field the request sets (values as given; the image as its path).

        A field the pipeline has no parameter for keeps a default name (`num_frames`, `image`), so the
        caller finds it among the keys the pipeline does not take."""
        frames_key = pipeline_parameter(accepted, FRAME_PARAMETERS) or "num_frames"
        image_key = pipeline_parameter(accepted, IMAGE_PARAMETERS) or "image"
        pairs = (("num_inference_steps", self.steps), ("height", self.height), ("width", self.width),
                 ("guidance_scale", self.guidance), (frames_key, self.frames),
                 ("negative_prompt", self.negative_prompt), ("max_sequence_length", self.max_sequence_length),
                 (image_key, self.image))
        return {key: value for key, value in pairs if value is not None}

    def call_kwargs(self, pipe: Any) -> dict[str, Any]:
        """Keyword arguments for the pipeline call.

        `extra` (built-in defaults) is filtered to what the pipeline takes; every field the request sets and
        every `params` key must be a parameter of the pipeline (`call_options.check_call` refuses the rest
        before load; here it is a `ConfigError` rather than a silent drop)."""
        accepted = inspect.signature(pipe.__call__).parameters
        explicit = {**self.explicit_kwargs(accepted), **self.params}
        if pipe_takes_guider_guidance(pipe):  # the scale goes to its guiders (`guider_guidance.guided`)
            explicit.pop("guidance_scale", None)
        if self.guidance is not None and "guidance_schedule" in accepted and "guidance_schedule" not in explicit:
            explicit["guidance_schedule"] = None  # a constant scale replaces a per-step schedule (Ideogram 4)
        unknown = sorted(key for key in explicit if key not in accepted)
        if unknown:
            raise ConfigError(f"{type(pipe).__name__} takes no {', '.join(unknown)}")
        if self.image is not None and (image_key := pipeline_parameter(accepted, IMAGE_PARAMETERS)) is not None \
                and image_key not in self.params:
            explicit[image_key] = load_condition_image(Path(self.image), condition_image_mode(pipe))
        kwargs: dict[str, Any] = {key: value for key, value in self.extra.items() if key in accepted}
        output_type = self.output_type
        if output_type == "pil" and map_kind(type(pipe).__name__) is not None:
            output_type = "np"  # a map pipeline returns arrays only ("np" or "pt"): they become images after
        kwargs.update(output_type=output_type, generator=torch.Generator("cpu").manual_seed(self.seed))
        if "prompt" in accepted:  # a class-conditional pipeline (DiT: `class_labels`) takes no prompt
            kwargs["prompt"] = self.prompt
        kwargs.update(explicit)
        return kwargs


class RequestCancelled(Exception):
    """The operator cancelled the request; raised between two blocks, inside the step (nothing is kept)."""

    def __init__(self, steps_done: int = 0, total_steps: int = 0) -> None:
        super().__init__(f"cancelled after {steps_done}/{total_steps} steps")
        self.steps_done, self.total_steps = steps_done, total_steps


def cancel_points(modules: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """Where a cancel is checked: every element of every ModuleList under `modules` (the DiT's blocks, an
    encoder's layers, a VAE's up/down blocks), so a cancel lands within one block's time, not a step's.

    A list may hold `None` where a layer is switched off (a VAE's mid-block attentions with
    `mid_block_add_attention=False`, Mochi's VAE): such an entry runs nothing and is skipped."""
    points: list[torch.nn.Module] = []
    for module in modules:
        for child in module.modules():
            if isinstance(child, torch.nn.ModuleList):
                points.extend(entry for entry in child if isinstance(entry, torch.nn.Module))
    return points


def watch_cancel(hooks: Hooks, modules: list[torch.nn.Module], cancel: threading.Event | None) -> None:
    """Forward pre-hooks raising `RequestCancelled` once `cancel` is set. Each runs before any other hook
    of its block (the streamer's too), so the request stops between blocks, where a failure is recovered
    from cleanly (tests/engine/test_faults.py); added to `hooks`."""
    if cancel is None:
        return

    def check(*_: Any) -> None:
        if cancel.is_set():
            raise RequestCancelled

    for point in cancel_points(modules):
        hooks.before(point, check, prepend=True)


class StepClock:
    """Times denoise steps between the first DiT forward and the step-end callback."""

    def __init__(self, bus: EventBus, request_id: int, total_steps: int, device: torch.device,
                 streamer: LayerwiseStreamer | None, cancel: threading.Event | None) -> None:
        self.bus, self.request_id, self.total_steps = bus, request_id, total_steps
        self.device, self.streamer, self.cancel = device, streamer, cancel
        self.started: float | None = None
        self.steps: list[StepTiming] = []
        self.first_forward: float | None = None  # perf_counter at the request's first DiT forward
        self.last_step_end: float | None = None
        self.latent_shape: tuple[int, ...] | None = None
        self.text_peak: int | None = None  # device allocator peak before the first DiT forward (CUDA)
        self.text_reserved: int | None = None  # the caching allocator's reserved peak then (CUDA)
        # the allocator's peak in the first step (where a regional compile traces and compiles: its workspace,
        # request_compile.compile_workspace) and over the later ones, kept apart by one reset (CUDA)
        self.first_step_peak: int | None = None
        self.later_steps_peak: int | None = None
        self.cache: Any = None  # the request's step cache (`step_cache.StepCache`), whose hits each step reports
        self.preview: Any = None  # the request's `step_preview.StepPreviewer` (None: step previews off)
        self.pipe: Any = None  # the pipeline called, whose own step count replaces a larger asked one
        self.hooked = False  # a denoiser forward is hooked (`on_dit_forward`): steps start there

    def on_dit_forward(self, *_: Any, **__: Any) -> None:
        if self.started is None:
            sync_compute(self.device)
            if self.first_forward is None and self.device.type == "cuda":
                self.text_peak = torch.cuda.max_memory_allocated(self.device)  # text encoding ends here
                self.text_reserved = torch.cuda.max_memory_reserved(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
            if self.streamer is not None:
                self.streamer.take_step_stats()  # transfers before the loop belong to no step
            self.started = time.perf_counter()
            if self.first_forward is None:
                self.first_forward = self.started
                self._steps_scheduled()

    def _steps_scheduled(self) -> None:
        """The steps the pipeline scheduled, set before its loop (`_num_timesteps`), where not the asked count:
        an image-to-image strength runs only its share of them (Flux img2img at 4 steps and 0.6: 3), PNDM
        without PRK steps one more (SD 1.x at 2 steps: 3)."""
        scheduled = getattr(self.pipe, "_num_timesteps", None)
        if isinstance(scheduled, int) and not isinstance(scheduled, bool) and 0 < scheduled != self.total_steps:
            self.total_steps = scheduled
            if self.preview is not None:
                self.preview.total_steps = scheduled

    def _note_step_peak(self) -> None:
        """At a step's end: the first step's allocator peak (then a reset), or the later steps' peak so far."""
        if self.device.type != "cuda":
            return
        peak = torch.cuda.max_memory_allocated(self.device)
        if self.first_step_peak is None:
            self.first_step_peak = peak
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.later_steps_peak = peak

    def denoised(self) -> bool:
        """A denoiser forward began since the last step's end (or no denoiser is hooked: cannot tell)."""
        return self.started is not None or not self.hooked

    def on_step_end(self, pipe: Any, step: int, _timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
        sync_compute(self.device)
        if self.first_forward is None and not self.steps:
            self._steps_scheduled()  # where no denoiser forward was hooked (one DLO does not stream)
        self._note_step_peak()
        previous, self.last_step_end = self.last_step_end, time.perf_counter()
        # from the step's first denoiser forward; without one hooked, from the previous step's end
        start = self.started if self.started is not None else previous
        wall = self.last_step_end - (start if start is not None else self.last_step_end)
        latents = callback_kwargs.get("latents")
        if isinstance(latents, torch.Tensor):
            self.latent_shape = tuple(latents.shape)
        stats = self.streamer.take_step_stats() if self.streamer is not None else None
        forwards, hits = self.cache.take_step() if self.cache is not None else (0, 0)
        timing = StepTiming(request_id=self.request_id, step=step + 1, total_steps=self.total_steps, wall_s=wall,
                            stall_s=stats.stall_s if stats else 0.0, h2d_bytes=stats.h2d_bytes if stats else 0,
                            sync_fetches=stats.sync_fetches if stats else 0, cache_forwards=forwards,
                            cache_hits=hits, skipped_blocks=stats.skipped_blocks if stats else 0,
                            skipped_bytes=stats.skipped_bytes if stats else 0)
        self.steps.append(timing)
        self.bus.publish(timing)
        if self.preview is not None:  # after the step's timing: a side stream's copy (step_preview)
            self.preview.capture(step + 1, latents)
        self.started = None
        if self.cancel is not None and self.cancel.is_set():
            pipe._interrupt = True
        return callback_kwargs


def total_steps_of(pipe: Any, request: GenerateRequest) -> int:
    if request.steps is not None:
        return request.steps
    return default_steps(pipe) or 0


@dataclass(frozen=True, slots=True)
class RunOutput:
    """What one pipeline call produced and where its time went."""

    frames: list[Any]  # every frame of the first batch item (PIL images, or arrays for output_type="np")
    is_video: bool  # the pipeline returned `frames` (a video), not `images`
    steps: list[StepTiming]
    latent_shape: tuple[int, ...] | None
    phases: dict[str, float]
    vae_decode_peak_bytes: int | None
    peak_before_decode: int | None  # device peak reached before the decode reset (CUDA), for the request peak
    text_peak: int | None = None  # device peak of text encoding (until the first DiT forward; CUDA)
    allocated_peak: int | None = None  # the request's allocated peak over every phase (CUDA)
    reserved_peak: int | None = None  # the caching allocator's reserved peak over every phase (CUDA)
    audio: AudioTrack | None = None  # the first item's waveform, when the pipeline returns audio (audio_track)
    guidance: float | None = None  # the guidance scale it ran with (`guider_guidance.guidance_used`)
    first_step_peak: int | None = None  # the allocator's peak in the first step (CUDA)
    later_steps_peak: int | None = None  # ... and over the steps after it (CUDA; None: one step)

    @property
    def allocator_slack(self) -> int | None:
        """Reserved above allocated at the peaks (cache and fragmentation): what the process held beyond
        torch's allocations, context aside. None off CUDA."""
        if self.reserved_peak is None or self.allocated_peak is None:
            return None
        return max(self.reserved_peak - self.allocated_peak, 0)

    @property
    def image(self) -> Any:
        return self.frames[0] if self.frames else None


def run_pipeline(pipe: Any, request: GenerateRequest, *, bus: EventBus, request_id: int, device: torch.device,
                 dits: list[torch.nn.Module], streamer: LayerwiseStreamer | None,
                 cancel: threading.Event | None = None, step_previews: bool = False,
                 preview_decoder: Any = None) -> RunOutput:
    """Call the pipeline once; returns every frame of the first batch item, step timings and phases.
    `step_previews`: publish each step's latent, small (`step_preview`), or what `preview_decoder` decodes."""
    clock = StepClock(bus, request_id, total_steps_of(pipe, request), device, streamer, cancel)
    clock.pipe = pipe
    if hasattr(pipe, "_num_timesteps"):
        pipe._num_timesteps = None  # set afresh by this call's loop, never the last request's
    kwargs = request.call_kwargs(pipe)
    if step_previews:
        clock.preview = step_previewer(pipe, bus, request_id, clock.total_steps, device, kwargs, preview_decoder)
    decode = DecodeMeter(device)
    hooks = Hooks()
    kwargs.update(attach_step_end(pipe, clock.on_step_end, hooks, clock.denoised))
    decode.install(getattr(pipe, "vae", None), hooks)
    # first among the DiT's pre-hooks: an expert switch (engine/loading/expert_switch.py) counts in its step
    for dit in dits:
        hooks.before(dit, clock.on_dit_forward, prepend=True)
    clock.hooked = bool(dits)
    components = getattr(pipe, "components", None) or {}
    others = [m for m in components.values() if isinstance(m, torch.nn.Module) and all(m is not d for d in dits)]
    watch_cancel(hooks, [*dits, *others], cancel)
    try:
        clock.cache = start_cache(request.cache, pipe, dits, streamer)  # diffusers' hooks, followed by the ring
        sync(device)
        call_start = time.perf_counter()
        with guided(pipe, request.guidance):
            guidance = guidance_used(pipe, kwargs)
            output = pipe(**kwargs)  # diffusers runs it under no_grad, exactly as the plain pipeline does
        sync(device)
    except RequestCancelled:
        raise RequestCancelled(len(clock.steps), clock.total_steps) from None
    finally:
        hooks.remove()
        if clock.cache is not None:
            clock.cache.remove()
        if clock.preview is not None:
            clock.preview.close()
    maps = prediction_frames(pipe, output)
    frames, is_video = (maps, False) if maps is not None else first_item_frames(output)
    audio = first_item_audio(output, pipe)
    if cancel is None or not cancel.is_set():  # a cancelled request keeps nothing and says so, not this
        if frames or audio is None:
            check_frames(frames, type(pipe).__name__)
        else:  # a pipeline that makes audio only (Stable Audio, ACE-Step)
            check_audio(audio, type(pipe).__name__)
    allocated = reserved = None
    before_decode = decode.peak_before_decode
    if before_decode is not None and clock.first_step_peak is not None:  # the first step's peak was reset
        before_decode = max(before_decode, clock.first_step_peak)
    if device.type == "cuda":  # the phases reset the peak counters: each phase's peaks, then what is left
        allocated = max(v for v in (clock.text_peak, clock.first_step_peak, decode.peak_before_decode,
                                    decode.peak_bytes, torch.cuda.max_memory_allocated(device)) if v is not None)
        reserved = max(v for v in (clock.text_reserved, decode.reserved_peak,
                                   torch.cuda.max_memory_reserved(device)) if v is not None)
    return RunOutput(frames=frames, is_video=is_video, steps=clock.steps,
                     latent_shape=decode.latent_shape or clock.latent_shape,
                     phases=phase_seconds(call_start, clock.first_forward, clock.last_step_end, decode),
                     vae_decode_peak_bytes=decode.peak_bytes, peak_before_decode=before_decode,
                     text_peak=clock.text_peak, allocated_peak=allocated, reserved_peak=reserved,
                     audio=audio, guidance=guidance, first_step_peak=clock.first_step_peak,
                     later_steps_peak=clock.later_steps_peak)
