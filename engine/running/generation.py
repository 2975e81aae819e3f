"""The engine's `generate`: one request on the loaded pipeline, from `RequestStarted` to its result.

A mixin of `Engine`, apart so the engine's module keeps to construction, planning and load/unload while
this one runs a request and settles what it taught: the profile saved for the next forecast (not when
the request skipped blocks, ran compiled, stepped down or was cancelled), the forecast check and the
phase events.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import torch

from ...offload.events import LogEvent
from ...offload.process_memory import release_freed_heap
from ..events import RequestFinished, RequestPhases, RequestStarted
from ..lifecycle import EngineState, Lifecycle
from ..planning.host_profile import peak_rss, with_host_peak
from ..results import GenerateResult, run_peak
from .cache_hits import keep_hits
from .call_defaults import with_call_defaults
from .call_options import requested_fps
from .oom_guard import guarded_request
from .order_watch import permute_profile
from .profiler import ProfileRecorder, forecast_check, request_size, save_quietly
from .request_compile import RegionalCompile, begin_compile, finish_compile, ran_compiled
from .runner import GenerateRequest, run_pipeline
from .tier_learning import learn_tier_rates

if TYPE_CHECKING:
    import itertools
    import threading
    from collections.abc import Callable

    from ..loading.placement import Placement
    from ..model_dir.discovery import ModelInfo
    from ..options import EngineOptions
    from ..planning.request_forecast import RequestForecast
    from ..planning.request_profile import RequestSize
    from .preview_decoder import PreviewDecoder


class Generation(Lifecycle):
    """`generate`; the engine sets `model`, `options`, `device`, `placement`, `preview_decoder`, `_compile`,
    `_request_ids` and `_lock`, and gives `forecast`, `set_loras`, `live_replan` and `fps`."""

    model: ModelInfo
    options: EngineOptions
    device: torch.device
    placement: Placement | None
    preview_decoder: PreviewDecoder | None
    _compile: RegionalCompile | None
    _request_ids: itertools.count[int]
    _lock: threading.RLock
    live_replan: bool
    fps: float | None
    forecast: Callable[[RequestSize], RequestForecast | None]
    set_loras: Callable[[tuple[tuple[str, float], ...]], float]

    def generate(self, request: GenerateRequest, cancel: threading.Event | None = None) -> GenerateResult:
        with self._lock:
            self._check_ready()
            if request.loras is not None and tuple(request.loras) != self.options.loras:
                self.set_loras(request.loras)  # a queued request's own LoRA set: switched between requests
            request = with_call_defaults(self.model, request)  # where the pipeline's own would fail
            request_id = next(self._request_ids)
            self._set_state(EngineState.RUNNING, f"request {request_id}")
            self.bus.publish(RequestStarted(request_id=request_id, prompt=request.prompt, steps=request.steps or 0,
                                            height=request.height or 0, width=request.width or 0, seed=request.seed))
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            forecast = self.forecast(request_size(request))
            assert self.plan is not None
            recorder = ProfileRecorder(self.pipe, self.plan, self.device)
            measured_plan = self.plan  # the first forward may correct the block order (and the plan)
            experts = self.placement.experts if self.placement else None
            if experts is not None:
                experts.begin_request(request_id, self.pipe)  # its schedule: the read ahead before each switch
            compiling = begin_compile(self._compile, self, request, forecast, request_id)
            start = time.perf_counter()
            try:
                try:
                    with guarded_request(self, request_id) as guard:  # no OOM ends a request (oom_guard)
                        run = run_pipeline(
                            self.pipe, request, bus=self.bus, request_id=request_id, device=self.device,
                            dits=[getattr(self.pipe, d.name) for d in self.model.denoisers],
                            streamer=self.placement.streamer if self.placement else None, cancel=cancel,
                            step_previews=self.options.step_previews, preview_decoder=self.preview_decoder)
                except BaseException:
                    if experts is not None:
                        with contextlib.suppress(Exception):  # the request's own error is the one to report
                            experts.restore()
                    raise
                if experts is not None:
                    experts.restore()  # the next request starts with the first expert placed
            except BaseException as exc:
                recorder.close()
                seconds = time.perf_counter() - start
                self.bus.publish(RequestFinished(request_id=request_id, seconds=seconds, ok=False,
                                                 error=f"{type(exc).__name__}: {exc}"))
                self._set_state(EngineState.READY, "request failed")
                raise
            seconds = time.perf_counter() - start
            release_freed_heap()  # the request's freed host transients (the peak below is VmHWM: already taken)
            peak = run_peak(run, torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None)
            streamer = self.placement.streamer if self.placement else None
            profile = recorder.finish(request, run, streamer.observed_bandwidth if streamer else None)
            if profile is not None and self.plan is not measured_plan and self.plan is not None:
                profile = permute_profile(profile, measured_plan, self.plan)
            host_peak = peak_rss()  # the process's peak RSS so far: what the host forecast learns from
            if profile is not None and self.plan is not None:
                profile = with_host_peak(profile, self.plan, host_peak, live_replan=self.live_replan)
            stepped = tuple(guard.events) if guard is not None else ()
            if request.cache is not None:  # its steps skipped blocks: not the model's times, only its hit rate
                profile = None
                keep_hits(self.model.pipeline_class, request.cache, run.steps)
            if ran_compiled(compiling):  # compiled block times are not the eager profile the forecast scales from
                profile = None
            if profile is not None and not stepped and not (cancel is not None and cancel.is_set()):
                problem = save_quietly(profile)
                if problem:
                    self.bus.publish(LogEvent(level="warning", message=problem))
            if not (cancel is not None and cancel.is_set()) and (learned := learn_tier_rates(self)):
                self.bus.publish(LogEvent(level="info", message=f"request {request_id}: {learned}"))
            check = forecast_check(request_id, forecast, run, peak, on_cpu=self.device.type == "cpu",
                                   host_peak=host_peak)
            self.bus.publish(check)
            self.bus.publish(RequestPhases(request_id=request_id, frames=len(run.frames), latent_shape=run.latent_shape,
                                           phases=dict(run.phases), vae_decode_peak_bytes=run.vae_decode_peak_bytes))
            compiled = finish_compile(self._compile, compiling, self, request, request_id, run)
            self.bus.publish(RequestFinished(request_id=request_id, seconds=seconds, ok=True))
            self._set_state(EngineState.READY)
            return GenerateResult(request_id, run.image, seconds, run.steps, peak, frames=run.frames,
                                  is_video=run.is_video, fps=requested_fps(request) or self.fps,
                                  latent_shape=run.latent_shape,
                                  phases=run.phases, vae_decode_peak_bytes=run.vae_decode_peak_bytes, check=check,
                                  cancelled=cancel is not None and cancel.is_set(), oom_step_downs=stepped,
                                  peak_reserved_bytes=run.reserved_peak, audio=run.audio,
                                  guidance=run.guidance, compile=compiled)
