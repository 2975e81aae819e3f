"""The forecast of a whole request before load: device peak and step time, each with its source.

Weights come from the safetensors headers (engine/plan.py). What the headers cannot give — per-block
compute, work outside the blocks, activations of each phase, the link's rate — comes from a
`RequestProfile`:
- `cached`: measured by an earlier request of this size on this device (the engine saves one after
  every request);
- `estimated`: scaled from a profile of another size (compute and activations in proportion to the
  pixels x frames), or the link rate from the start-up probe;
- `unknown`: nothing measured yet on this device; the peak is then the weights alone and says so.

Peak = the largest phase: weights on the device (resident components, DiT non-block weights,
resident blocks, the ring's k slots) + for text encoding the largest staged encoder and its
activations, for the denoise loop the DiT's activations, for decode the staged VAE and its
activations. Step time = the streamer's copy schedule replayed over the profile (step_forecast).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .lean import LeanCost, decode_extra, lean_costs, text_stage_bytes
from .plan import Plan
from .request_profile import RequestProfile, RequestSize, any_profile, load_profile
from .stream_choice import DitProfile, evaluate, profile_from_timings

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
    lean: list[LeanCost] = field(default_factory=list)  # lean phases in effect (engine/lean.py)


def staged_bytes(plan: Plan, role: str) -> int:
    """The largest staged component of a role (only one auxiliary stage is on the device at a time)."""
    return max((c.info.nbytes for c in plan.components if c.residency == "staged" and c.info.role == role), default=0)


def _pixels(size: RequestSize) -> float | None:
    if not (size.height and size.width):
        return None
    return float(size.height * size.width * (size.frames or 1))


def scaled_profile(profile: RequestProfile, size: RequestSize) -> RequestProfile | None:
    """Another size's profile scaled to `size` (compute and activations in proportion to pixels x frames)."""
    have, want = _pixels(profile.size), _pixels(size)
    if not have or not want:
        return None
    r = want / have

    def scale(x: int | None) -> int | None:
        return None if x is None else int(x * r)

    return profile.model_copy(update=dict(
        size=size, block_compute_s=[c * r for c in profile.block_compute_s], other_s=profile.other_s * r,
        text_extra_bytes=profile.text_extra_bytes, denoise_extra_bytes=scale(profile.denoise_extra_bytes),
        decode_extra_bytes=scale(profile.decode_extra_bytes)))


def dit_profile(plan: Plan, profile: RequestProfile | None) -> DitProfile | None:
    """One forward's profile (with two experts: one expert's blocks, `Plan.forward`)."""
    blocks = tuple(b.nbytes for b in plan.forward[0])
    if profile is None or len(profile.block_compute_s) != len(blocks):
        return None
    forward = sum(profile.block_compute_s) + profile.other_s
    return profile_from_timings(blocks, profile.block_compute_s, forward, profile.forwards_per_step,
                                profile.denoise_extra_bytes or 0)


def phase_bytes(profile: RequestProfile | None) -> PhaseBytes:
    if profile is None:
        return PhaseBytes(0, 0, 0)
    return PhaseBytes(profile.text_extra_bytes or 0, profile.denoise_extra_bytes or 0, profile.decode_extra_bytes or 0)


def dit_fixed_bytes(plan: Plan) -> int:
    """Device weights outside the DiT's blocks: resident components and DiT non-block weights."""
    resident_blocks = sum(b.nbytes for b in plan.forward[0] if not b.streamed)
    return plan.forecast.device_resident_bytes - resident_blocks


def forecast_request(plan: Plan, size: RequestSize, profile: RequestProfile | None, profile_source: Source,
                     bandwidth: float | None, bandwidth_source: Source, overlap: bool = True) -> RequestForecast:
    """Peak and step time of one request of `size` under `plan` (see the module docstring).

    `overlap=False` (a CPU device) adds every copy to the compute: a CPU copies synchronously."""
    notes: list[str] = []
    extras = phase_bytes(profile)
    peaks = phase_peaks(plan, size, extras)
    lean = lean_costs(plan, size, phase_peaks(plan, size, extras, lean=False), peaks, bandwidth)
    phase = max(peaks, key=lambda k: peaks[k])
    measured_peaks = profile is not None and profile.denoise_extra_bytes is not None
    if not measured_peaks:  # no profile yet, or one from a device without an allocator (a CPU)
        notes.append("activations not measured yet at this size: the peak counts weights only")
    dit = dit_profile(plan, profile)
    step_s = floor_s = None
    if dit is not None and (bandwidth or not plan.forecast.num_streamed_blocks):
        choice = evaluate(dit, plan.forward[1], bandwidth or 1.0, dit_fixed_bytes(plan))
        serial = choice.forward.compute_s + choice.forward.transfer_s
        step_s = choice.step_s if overlap else serial * dit.forwards_per_step
        floor_s = (choice.forward.floor_s if overlap else serial) * dit.forwards_per_step
    elif dit is None:
        notes.append("step time: no request of this model has run on this device yet")
    return RequestForecast(size=size, peak_bytes=peaks[phase], peak_phase=phase,
                           peak_source=profile_source if measured_peaks else "unknown", phase_peaks=peaks,
                           step_s=step_s, floor_s=floor_s,
                           step_source=profile_source if step_s is not None else "unknown",
                           bandwidth=bandwidth, bandwidth_source=bandwidth_source if bandwidth else "unknown",
                           notes=notes, lean=lean)


def phase_peaks(plan: Plan, size: RequestSize, extras: PhaseBytes, lean: bool = True) -> dict[str, int]:
    """Each phase's device peak: the weights on the device, the phase's staged component (a streamed
    encoder's stage is its non-layer weights and two layers) and its bytes above the weights (a tiled
    decode's are one tile's share); `lean=False`: as without any lean phase."""
    f = plan.forecast
    base = f.device_resident_bytes + f.streaming_slots * f.largest_streamed_block_bytes
    return {
        "text_encoding": base + (text_stage_bytes(plan) if lean else staged_bytes(plan, "encoder")) + extras.text_extra,
        "denoise": base + extras.denoise_extra,
        "vae_decode": base + staged_bytes(plan, "vae") + (decode_extra(plan, size, extras.decode_extra) if lean
                                                          else extras.decode_extra),
    }


def known_profile(plan: Plan, size: RequestSize, device: str,
                  notes: list[str] | None = None) -> tuple[RequestProfile | None, Source]:
    """This size's cached profile ("cached"), else another size's scaled to it ("estimated"), else none.

    A cached profile that cannot be used (not a regular file, too large, numbers out of range) is
    ignored with one line in `notes`."""
    model = plan.model
    profile = load_profile(model.path, model.nbytes, device, size, notes)
    if profile is not None:
        return profile, "cached"
    other = any_profile(model.path, model.nbytes, device, notes)
    return (scaled_profile(other, size) if other is not None else None), "estimated"


def forecast_for(plan: Plan, size: RequestSize, device: str, observed_bandwidth: float | None = None,
                 probe_bandwidth: float | None = None) -> RequestForecast:
    """The forecast from what is known (`known_profile`); the link rate as the streamer observed it,
    else the cached one, else the probe's."""
    cache_notes: list[str] = []
    profile, source = known_profile(plan, size, device, cache_notes)
    bw_source: Source
    if observed_bandwidth:
        bandwidth, bw_source = observed_bandwidth, "measured"
    elif profile is not None and profile.bandwidth_bytes_per_s:
        bandwidth, bw_source = profile.bandwidth_bytes_per_s, "cached"
    else:
        bandwidth, bw_source = probe_bandwidth, "estimated"
    forecast = forecast_request(plan, size, profile, source, bandwidth, bw_source, overlap=device != "cpu")
    forecast.notes[:0] = cache_notes
    return forecast
