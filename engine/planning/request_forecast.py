"""The forecast of a whole request before load: device peak and step time, each with its source.

Weights come from the safetensors headers (engine/planning/plan.py). What the headers cannot give — per-block
compute, work outside the blocks, activations of each phase, the link's rate — comes from a
`RequestProfile`:
- `cached`: measured by an earlier request of this size on this device (the engine saves one after
  every request);
- `estimated`: scaled from a profile of another size, or estimated from the configs before any
  profile exists (engine/planning/profile_basis.py; `peak_basis` / `step_basis` say which: "scaled from
  1024x1024", "estimated from config"), or the link rate from the start-up probe or the device table;
- `unknown`: nothing to go on (a step time on a CPU before a request has run); a peak without any
  activations is the weights alone and says so.

Peak = the largest phase: weights on the device (resident components, DiT non-block weights,
resident blocks, the ring's k slots, with fp8 storage the upcast scratch) + for text encoding the
largest staged encoder and its activations, for the denoise loop the DiT's activations, for decode
the staged VAE and its activations. Step time = the streamer's copy schedule replayed over the
profile (step_forecast), each block's compute with its fp8 upcast added (engine/planning/upcast_cost.py), but
for resident blocks kept upcast (their device bytes counted at the compute dtype instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from .activation_estimate import BASIS
from .device_footprint import DeviceOverhead, device_overhead
from .host_forecast import HostForecast
from .host_profile import host_forecast_for
from .lean import LeanCost, decode_extra, lean_costs, text_stage_bytes
from .plan import Plan
from .profile_basis import profile_for
from .request_profile import RequestProfile, RequestSize
from .scale_bounds import Bounds, range_text
from .slack_config import slack_for
from .stream_choice import DitProfile, evaluate, profile_from_timings
from .upcast_cost import upcast_seconds

Source = Literal["measured", "cached", "estimated", "unknown"]


@dataclass(frozen=True, slots=True)
class PhaseBytes:
    """Bytes above the device weights in each phase, and which staged weights join them there."""

    text_extra: int
    denoise_extra: int
    decode_extra: int


@dataclass(frozen=True, slots=True)
class RequestForecast:
    size: RequestSize
    peak_bytes: int
    peak_phase: str
    peak_source: Source
    phase_peaks: dict[str, int]
    step_s: float | None
    floor_s: float | None
    step_source: Source
    bandwidth: float | None
    bandwidth_source: Source
    notes: list[str] = field(default_factory=list)
    peak_basis: str = ""  # what the peak's activations rest on: "cached", "scaled from …", "estimated from config"
    step_basis: str = ""
    overhead: DeviceOverhead | None = None  # outside torch's allocations (device_footprint); None: not counted
    assumed: tuple[str, ...] = ()  # size fields the request left out, taken from the pipeline's defaults
    lean: list[LeanCost] = field(default_factory=list)  # lean phases in effect (engine/planning/lean.py)
    # the allocator's reserved-above-allocated measured by a request of this very size (cached profile)
    allocator_slack: int | None = None
    budget: int | None = None  # the --vram-budget it runs under: the allocator is capped inside it
    host: HostForecast | None = None  # the process's host memory per phase (engine/planning/host_forecast.py)

    @property
    def peak_label(self) -> str:
        """The peak's source as shown: its basis ("estimated from config", "scaled from 64x64") or source."""
        return self.peak_basis if self.peak_source != "unknown" and self.peak_basis else self.peak_source

    @property
    def step_label(self) -> str:
        return self.step_basis if self.step_source != "unknown" and self.step_basis else self.step_source

    @property
    def size_line(self) -> str | None:
        """Which size was assumed, when the request left some of it to the pipeline (None: all given)."""
        if not self.assumed:
            return None
        fields = ", ".join(f.replace("_", " ") for f in self.assumed)
        return f"size {self.size.label()}: {fields} from the pipeline's defaults (no flag given)"

    @property
    def process_peak_bytes(self) -> int | None:
        """The predicted device memory of the process (NVML's per-process figure) at the peak."""
        if self.overhead is None:
            return None
        return self.overhead.process_bytes(self.peak_bytes, self.allocator_slack, self.budget)


def staged_bytes(plan: Plan, role: str) -> int:
    """The largest staged component of a role (only one auxiliary stage is on the device at a time)."""
    return max((c.info.nbytes for c in plan.components if c.residency == "staged" and c.info.role == role), default=0)


def dit_profile(plan: Plan, profile: RequestProfile | None) -> DitProfile | None:
    """One forward's profile (with two experts: one expert's blocks, `Plan.forward`)."""
    blocks = tuple(b.nbytes for b in plan.forward[0])
    if profile is None or len(profile.block_compute_s) != len(blocks):
        return None
    # fp8 storage: each block's upcast runs before it on the compute stream, outside its timed compute (none for
    # a resident block kept upcast: converted once at load)
    upcast = upcast_seconds([b.forward_upcast_elems for b in plan.forward[0]], profile.device)
    compute = [c + u for c, u in zip(profile.block_compute_s, upcast, strict=True)]
    forward = sum(compute) + profile.other_s
    return profile_from_timings(blocks, compute, forward, profile.forwards_per_step, profile.denoise_extra_bytes or 0)


def phase_bytes(profile: RequestProfile | None) -> PhaseBytes:
    if profile is None:
        return PhaseBytes(0, 0, 0)
    return PhaseBytes(profile.text_extra_bytes or 0, profile.denoise_extra_bytes or 0, profile.decode_extra_bytes or 0)


def dit_fixed_bytes(plan: Plan) -> int:
    """Device weights outside the DiT's blocks: resident components and DiT non-block weights."""
    resident_blocks = sum(b.device_bytes for b in plan.forward[0] if not b.streamed)
    return plan.forecast.device_resident_bytes - resident_blocks


def _source(basis: str, default: Source) -> Source:
    if not basis:
        return default
    return "cached" if basis == "cached" else "estimated"


def forecast_request(plan: Plan, size: RequestSize, profile: RequestProfile | None, profile_source: Source,
                     bandwidth: float | None, bandwidth_source: Source, overlap: bool = True,
                     peak_basis: str = "", step_basis: str = "") -> RequestForecast:
    """Peak and step time of one request of `size` under `plan` (see the module docstring).

    `overlap=False` (a CPU device) adds every copy to the compute: a CPU copies synchronously.
    `peak_basis` / `step_basis` (profile_basis.KnownProfile) label each figure; without them both
    carry `profile_source`."""
    notes: list[str] = []
    extras = phase_bytes(profile)
    peaks = phase_peaks(plan, size, extras)
    lean = lean_costs(plan, size, phase_peaks(plan, size, extras, lean=False), peaks, bandwidth)
    phase = max(peaks, key=lambda k: peaks[k])
    measured_peaks = profile is not None and any(
        x is not None for x in (profile.text_extra_bytes, profile.denoise_extra_bytes, profile.decode_extra_bytes))
    if not measured_peaks:  # no profile yet, or one from a device without an allocator (a CPU)
        notes.append("activations not known at this size: the peak counts weights only")
    dit = dit_profile(plan, profile)
    step_s = floor_s = None
    if dit is not None and (bandwidth or not plan.forecast.num_streamed_blocks):
        choice = evaluate(dit, plan.forward[1], bandwidth or 1.0, dit_fixed_bytes(plan))
        serial = choice.forward.compute_s + choice.forward.transfer_s
        step_s = choice.step_s if overlap else serial * dit.forwards_per_step
        floor_s = (choice.forward.floor_s if overlap else serial) * dit.forwards_per_step
        if not (step_s > 0 and math.isfinite(step_s)):  # nothing to time (no block): no step time, never 0
            step_s = floor_s = None
    if step_s is None and dit is not None and not bandwidth:
        notes.append("step time: the host→device link's rate is not known yet")
    elif step_s is None:
        notes.append("step time: no request of this model has run on this device yet"
                     + ("" if overlap else " (a CPU's compute is not estimated)"))
    peak_src = _source(peak_basis, profile_source) if measured_peaks else "unknown"
    step_src = _source(step_basis, profile_source) if step_s is not None else "unknown"
    return RequestForecast(size=size, peak_bytes=peaks[phase], peak_phase=phase, peak_source=peak_src,
                           phase_peaks=peaks, step_s=step_s, floor_s=floor_s, step_source=step_src,
                           bandwidth=bandwidth, bandwidth_source=bandwidth_source if bandwidth else "unknown",
                           notes=notes, lean=lean, peak_basis=peak_basis if measured_peaks else "",
                           step_basis=step_basis if step_s is not None else "")


def phase_peaks(plan: Plan, size: RequestSize, extras: PhaseBytes, lean: bool = True) -> dict[str, int]:
    """Each phase's device peak: the weights on the device, the phase's staged component (a streamed
    encoder's stage is its non-layer weights and two layers) and its bytes above the weights (a tiled
    decode's are one tile's share); `lean=False`: as without any lean phase."""
    f = plan.forecast
    base = f.device_resident_bytes + f.streaming_slots * f.largest_streamed_block_bytes + f.upcast_scratch_bytes
    return {
        "text_encoding": base + (text_stage_bytes(plan) if lean else staged_bytes(plan, "encoder")) + extras.text_extra,
        "denoise": base + extras.denoise_extra,
        "vae_decode": base + staged_bytes(plan, "vae") + (decode_extra(plan, size, extras.decode_extra) if lean
                                                          else extras.decode_extra),
    }


def known_profile(plan: Plan, size: RequestSize, device: str,
                  notes: list[str] | None = None) -> tuple[RequestProfile | None, Source]:
    """This size's cached profile ("cached"), else another size's scaled to it, else one estimated from
    the configs ("estimated"), else none (`profile_basis.profile_for`, which also says which).

    A cached profile that cannot be used (not a regular file, too large, numbers out of range) is
    ignored with one line in `notes`."""
    known = profile_for(plan, size, device, notes)
    return known.profile, known.source  # type: ignore[return-value]


def forecast_for(plan: Plan, size: RequestSize, device: str, observed_bandwidth: float | None = None,
                 probe_bandwidth: float | None = None, *, live_replan: bool = False,
                 tier_transfer_s: float | None = None) -> RequestForecast:
    """The one forecast of a request (`plan`, `run`, the console's plan screen and generate dialog all
    call it) from what is known (`known_profile`).

    The link rate: a profile's measured one first (this size's, or the one scaled from: the streamer's
    own copies of this model on this device), else the streamer's observed rate, else the probe's, else
    the device table's. So once a request has run, `plan` and the console give the same figure; before,
    only a console that has measured the link knows better than the table. `live_replan`: the load keeps
    masters of everything (the console's, and `run`'s with a budget): the host forecast counts them.
    `tier_transfer_s`: one forward's transfer under `--ram-budget`'s host tiers, max(link, page-cache + disk
    reads) (`RamPlan`): where the tiers' reads take longer than the link, they are the step's floor."""
    cache_notes: list[str] = []
    known = profile_for(plan, size, device, cache_notes)
    profile = known.profile
    measured_link = known.step_basis not in ("", BASIS)  # cached or scaled: the streamer's own rate
    bw_source: Source
    if measured_link and profile is not None and profile.bandwidth_bytes_per_s:
        bandwidth = profile.bandwidth_bytes_per_s
        bw_source = "cached" if known.step_basis == "cached" else "estimated"
    elif observed_bandwidth:
        bandwidth, bw_source = observed_bandwidth, "measured"
    elif probe_bandwidth:  # measured here and now beats a table
        bandwidth, bw_source = probe_bandwidth, "estimated"
    elif profile is not None and profile.bandwidth_bytes_per_s:
        bandwidth, bw_source = profile.bandwidth_bytes_per_s, "estimated"
    else:
        bandwidth, bw_source = None, "estimated"
    overlap = device != "cpu"
    forecast = forecast_request(plan, known.size, profile, known.source, bandwidth, bw_source,  # type: ignore[arg-type]
                                overlap=overlap, peak_basis=known.peak_basis, step_basis=known.step_basis)
    if known.step_range is not None and forecast.step_s is not None:
        forecast = _bounded_step(plan, known.size, forecast, known.step_range, bandwidth, overlap)
    forecast.notes[:0] = cache_notes
    assumed = tuple(k for k, v in size.model_dump().items() if v is None and getattr(known.size, k) is not None)
    slack = slack_for(profile, plan) if known.source == "cached" else None  # this size, this plan
    host = host_forecast_for(plan, known.size, device, profile, live_replan=live_replan)
    if tier_transfer_s is not None and profile is not None:
        forecast = tier_bound(forecast, tier_transfer_s * profile.forwards_per_step)
    return replace(forecast, assumed=assumed, overhead=device_overhead(device), allocator_slack=slack, host=host)


def tier_bound(forecast: RequestForecast, tier_step_s: float) -> RequestForecast:
    """The step at least the host tiers' reads: a block read from the page cache or the disk each forward
    bounds the step however fast the link is (measured: a Flux-size DiT mostly on disk ran its step at the
    tiers' figure, 18x the link's)."""
    if forecast.step_s is None or forecast.floor_s is None or tier_step_s <= forecast.floor_s:
        return forecast
    note = f"step floor: the host tiers' reads, {tier_step_s:.3f} s a step, over the link's {forecast.floor_s:.3f} s"
    return replace(forecast, floor_s=tier_step_s, step_s=max(forecast.step_s, tier_step_s),
                   notes=[*forecast.notes, note])


def _bounded_step(plan: Plan, size: RequestSize, forecast: RequestForecast,
                  ends: tuple[RequestProfile, RequestProfile], bandwidth: float | None,
                  overlap: bool) -> RequestForecast:
    """A scaled step time: the replay at each end of the blocks' range (`scale_bounds`); the middle when
    they are close enough, else no step time, with the range in a note."""
    low, high = (forecast_request(plan, size, end, "estimated", bandwidth, "estimated", overlap=overlap)
                 for end in ends)
    if low.step_s is None or high.step_s is None:
        return forecast
    step, floor = Bounds(low.step_s, high.step_s), Bounds(low.floor_s or 0.0, high.floor_s or 0.0)
    if step.known:
        return replace(forecast, step_s=step.middle, floor_s=floor.middle if floor.high else None)
    note = (f"step time: unknown until measured at this size ({forecast.step_basis} it lies in "
            f"{range_text(step.low, step.high)}: that size's time may be fixed overhead or compute)")
    return replace(forecast, step_s=None, floor_s=None, step_source="unknown", step_basis="",
                   notes=[*forecast.notes, note])
