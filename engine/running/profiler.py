"""Measure a request's profile while it runs, and check the forecast made before it against it.

Around each request the engine installs a `BlockTimer` on every DiT block (execution order, after
the streamer's hooks), remembers the device bytes allocated before the call, and afterwards turns
the step timings, phase peaks and the streamer's copy rate into a `RequestProfile` (saved to the
cache) and a `ForecastCheck` event: predicted vs measured peak and step time.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from ...offload.block_timing import BlockTimer
from ..events import ForecastCheck
from ..loading.placement import block_modules
from ..planning.lean import text_stage_bytes, untiled_decode_extra
from ..planning.model_configs import fill_size
from ..planning.plan import Plan
from ..planning.request_forecast import RequestForecast, staged_bytes
from ..planning.request_profile import RequestProfile, RequestSize, device_name, save_profile
from ..planning.slack_config import plan_key
from ..planning.stream_choice import profile_from_timings
from .runner import GenerateRequest, RunOutput


def request_size(request: GenerateRequest) -> RequestSize:
    return RequestSize(height=request.height, width=request.width, frames=request.frames,
                       max_sequence_length=request.max_sequence_length, guidance=request.guidance)


def plan_blocks(pipe: Any, plan: Plan) -> list[torch.nn.Module]:
    lists = {(d.name, b.attr): b for d in plan.model.denoisers for b in d.block_lists}
    return [block_modules(getattr(pipe, b.dit), b.attr, lists[(b.dit, b.attr)].items)[b.index] for b in plan.blocks]


class ProfileRecorder:
    """One request's measurement: install before the call, `finish` after it."""

    def __init__(self, pipe: Any, plan: Plan, device: torch.device) -> None:
        self.plan, self.device = plan, device
        self.timer = BlockTimer(plan_blocks(pipe, plan), device) if plan.blocks else None
        self.weights_before = torch.cuda.memory_allocated(device) if device.type == "cuda" else None

    def close(self) -> None:
        if self.timer is not None:
            self.timer.remove()
            self.timer = None

    def finish(self, request: GenerateRequest, run: RunOutput, bandwidth: float | None) -> RequestProfile | None:
        """The measured profile (None when no step ran); timer removed either way."""
        timer, self.timer = self.timer, None
        if timer is None or not run.steps:
            if timer is not None:
                timer.remove()
            return None
        compute, forwards = timer.take(firsts=[e.start for e in self.plan.experts] or [0])
        forward_blocks = self.plan.forward[0]
        if self.plan.experts:  # one forward runs one expert: the first's blocks, or the other's if it never ran
            spans = [compute[e.start:e.stop] for e in self.plan.experts]
            compute = next((c for c in spans if any(c)), spans[0])
        timer.remove()
        steps = len(run.steps)
        per_step = max(1, round(forwards / steps)) if forwards else 1
        steady = run.steps[1:] or run.steps  # the first step runs cold: kernel selection, allocator growth
        if self.device.type == "cpu":  # other processes share a CPU's cores: its fastest step is this one's cost
            steady = [min(steady, key=lambda s: s.wall_s)]
        busy = statistics.median(s.wall_s - s.stall_s for s in steady) / per_step
        text = denoise = decode = None
        base = self.weights_before
        if base is not None:
            if run.text_peak is not None:
                text = max(run.text_peak - base - text_stage_bytes(self.plan), 0)  # a streamed encoder's stage
            denoise_peak = run.peak_before_decode if run.vae_decode_peak_bytes is not None else None
            if denoise_peak is not None:
                denoise = max(denoise_peak - base, 0)
            if run.vae_decode_peak_bytes is not None:
                decode = max(run.vae_decode_peak_bytes - base - staged_bytes(self.plan, "vae"), 0)
                decode = untiled_decode_extra(self.plan, request_size(request), decode)  # stored untiled
        # the timing events also catch launch gaps (the host running hooks while the device waits):
        # the blocks are scaled to the steps' own busy time (wall - stall), the figure the replay needs
        dit = profile_from_timings([b.nbytes for b in forward_blocks], compute, busy, per_step, 0)
        if self.device.type == "cpu":  # copies are the steps' stall: their rate is what the replay adds back
            bandwidth = _step_copy_rate(steady) or bandwidth
        model = self.plan.model
        try:  # a profile holds only finite, in-range figures (the cache is read back with those bounds)
            return RequestProfile(
                model=str(Path(model.path).resolve()), model_bytes=model.nbytes, device=device_name(self.device),
                size=fill_size(model, request_size(request)), block_compute_s=[max(c, 0.0) for c in dit.compute_s],
                other_s=max(dit.other_s, 0.0), forwards_per_step=per_step,
                text_extra_bytes=text, denoise_extra_bytes=denoise, decode_extra_bytes=decode,
                allocator_slack_bytes=run.allocator_slack,
                allocator_slack_plan=plan_key(self.plan) if run.allocator_slack is not None else None,
                bandwidth_bytes_per_s=bandwidth if bandwidth and 1.0 < bandwidth < 1e15 else None,
                measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
        except ValidationError:  # e.g. a timing that overflowed: no profile rather than a bad one
            return None


def _step_copy_rate(steps: list[Any]) -> float | None:
    """Bytes over stall seconds of the (median) step: on a CPU every copy is exposed in the step (the
    copy ledger's rate also times the cold copies of the attach, and misses what a step pays)."""
    copied = statistics.median(s.h2d_bytes for s in steps)
    stall = statistics.median(s.stall_s for s in steps)
    return copied / stall if copied > 0 and stall > 0 else None


def save_quietly(profile: RequestProfile) -> str | None:
    """Save to the cache; a cache that cannot be written costs the next plan its figures, nothing more."""
    try:
        save_profile(profile)
    except OSError as exc:
        return f"profile not cached: {exc}"
    return None


def forecast_check(request_id: int, forecast: RequestForecast | None, run: RunOutput,
                   peak: int | None, on_cpu: bool = False, host_peak: int | None = None) -> ForecastCheck:
    """Predicted vs measured: the median steady step, on a CPU the fastest (as the profile takes it);
    `host_peak`: the process's peak RSS, against the host forecast."""
    host = forecast.host if forecast is not None else None
    walls = [s.wall_s for s in run.steps[1:]] or [s.wall_s for s in run.steps]  # the first step warms up
    if on_cpu and walls:
        walls = [min(walls)]
    return ForecastCheck(
        request_id=request_id,
        predicted_peak=forecast.peak_bytes if forecast is not None and forecast.peak_source != "unknown" else None,
        measured_peak=peak, peak_source=forecast.peak_source if forecast else "unknown",
        predicted_step_s=forecast.step_s if forecast else None,
        measured_step_s=statistics.median(walls) if walls else None,
        step_source=forecast.step_source if forecast else "unknown",
        peak_basis=forecast.peak_basis if forecast and forecast.peak_source != "unknown" else "",
        step_basis=forecast.step_basis if forecast and forecast.step_source != "unknown" else "",
        predicted_slack=forecast.allocator_slack if forecast is not None else None,
        predicted_host_peak=host.peak_bytes if host is not None else None, measured_host_peak=host_peak,
        host_source=host.baseline_source if host is not None else "",
        predicted_host_base=host.part("process baseline") if host is not None else None)
