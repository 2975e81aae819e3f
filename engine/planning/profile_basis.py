"""Which profile a forecast rests on, and how it says so: cached, scaled from another size, or
estimated from the configs.

Order of preference for a request of `size` on `device` (the size first filled with the pipeline's
defaults, `model_configs.fill_size`, so `plan` without size flags and `run` without them meet):
1. `cached`: a profile measured at exactly this size on this device;
2. `scaled from <size>`: the newest profile of another size on this device, each figure multiplied
   by how the config estimate grows from that size to this one (activations by tokens, block compute
   by FLOPs with attention's quadratic term: `activation_estimate`, `compute_estimate`); pixels x
   frames where the configs say too little. A block's time may be fixed work more than FLOPs, so its
   scaled time is a range (`scale_bounds`): the middle where the range is narrow, else the step time
   is unknown until measured;
3. `estimated from config`: activations from the configs, and on a device the throughput table
   names, block compute from FLOPs and the link rate by PCIe generation; on a CPU no step time.

A measured profile without activations (a CPU has no allocator to measure them) takes them from the
config estimate, so the peak's basis and the step's basis are given separately.
"""

from __future__ import annotations

from dataclasses import dataclass

from .activation_estimate import BASIS, PhaseEstimate, estimate_phases
from .compute_estimate import estimated_profile, forward_flops, peak_flops
from .model_configs import fill_size
from .plan import Plan
from .request_profile import RequestProfile, RequestSize, any_profile, load_profile
from .scale_bounds import Bounds, scaled_time


@dataclass(frozen=True, slots=True)
class KnownProfile:
    profile: RequestProfile | None
    source: str  # "cached", "estimated" or "unknown" (the forecast's Source)
    peak_basis: str  # "cached", "scaled from 64x64", "estimated from config", "" (none)
    step_basis: str
    size: RequestSize  # the size with the pipeline's defaults filled in
    step_range: tuple[RequestProfile, RequestProfile] | None = None  # scaled: block times at each end


MAX_S, MAX_BYTES = 1e6, 1 << 60  # a profile's bounds (request_profile): copies skip validation, so cap here


def _cap(x: float | None) -> int | None:
    return None if x is None else int(min(max(x, 0), MAX_BYTES))


def _pixels(size: RequestSize) -> float | None:
    if not (size.height and size.width):
        return None
    return float(size.height * size.width * (size.frames or 1))


def _ratio(new: float | int | None, old: float | int | None) -> float | None:
    return new / old if new and old else None


@dataclass(frozen=True, slots=True)
class Scaled:
    """A profile scaled to another size: the middle figures, and the block times at each end of the
    range they may lie in (`scale_bounds`)."""

    profile: RequestProfile
    low: RequestProfile
    high: RequestProfile


def scale_profile(plan: Plan, profile: RequestProfile, size: RequestSize) -> Scaled | None:
    """`profile` (another size) scaled to `size` by the config estimate's growth (each block's FLOPs,
    bounded by the fixed work its time may hold: `scale_bounds`); by pixels x frames where the estimate
    cannot say. None when neither can (a size left to the pipeline)."""
    have, want = _pixels(profile.size), _pixels(size)
    linear = want / have if have and want else None
    model = plan.model
    old, new = estimate_phases(model, profile.size), estimate_phases(model, size)
    blocks = plan.forward[0]
    f_old, f_new = forward_flops(model, blocks, profile.size), forward_flops(model, blocks, size)
    peak = peak_flops(profile.device)
    if f_old and f_new and len(f_old) == len(profile.block_compute_s):
        compute = [scaled_time(c, n / o, o / peak if peak else 0.0) if o else Bounds(c, c)
                   for c, n, o in zip(profile.block_compute_s, f_new, f_old, strict=True)]
        other = scaled_time(profile.other_s, sum(f_new) / sum(f_old) if sum(f_old) else 1.0)
    elif linear is not None:
        compute, other = [scaled_time(c, linear) for c in profile.block_compute_s], scaled_time(profile.other_s, linear)
    else:
        return None

    def scale(x: int | None, r: float | None, fallback: float | None) -> int | None:
        factor = r if r is not None else fallback
        return None if x is None or factor is None else _cap(x * factor)

    middle = profile.model_copy(update=dict(
        size=size, block_compute_s=[min(b.middle, MAX_S) for b in compute], other_s=min(other.middle, MAX_S),
        text_extra_bytes=scale(profile.text_extra_bytes, _ratio(new.text_extra, old.text_extra), 1.0),
        denoise_extra_bytes=scale(profile.denoise_extra_bytes, _ratio(new.denoise_extra, old.denoise_extra), linear),
        decode_extra_bytes=scale(profile.decode_extra_bytes, _ratio(new.decode_extra, old.decode_extra), linear),
        allocator_slack_bytes=None))  # the allocator's cache is that size's own: not scaled

    def end(pick: str) -> RequestProfile:
        return middle.model_copy(update=dict(block_compute_s=[min(getattr(b, pick), MAX_S) for b in compute],
                                             other_s=min(getattr(other, pick), MAX_S)))

    return Scaled(middle, end("low"), end("high"))


def _with_estimated_peaks(profile: RequestProfile, phases: PhaseEstimate) -> RequestProfile:
    return profile.model_copy(update=dict(text_extra_bytes=_cap(phases.text_extra),
                                          denoise_extra_bytes=_cap(phases.denoise_extra),
                                          decode_extra_bytes=_cap(phases.decode_extra)))


def profile_for(plan: Plan, size: RequestSize, device: str, notes: list[str] | None = None) -> KnownProfile:
    """The profile a forecast of `size` on `device` rests on (see the module docstring)."""
    model = plan.model
    asked, size = size, fill_size(model, size)
    found = load_profile(model.path, model.nbytes, device, size, notes)
    if found is None and asked != size:  # cached as asked (before sizes were filled): the same request
        found = load_profile(model.path, model.nbytes, device, asked, notes)
    source, basis = "cached", "cached"
    step_range = None
    if found is None:
        other = any_profile(model.path, model.nbytes, device, notes)
        scaled = scale_profile(plan, other, size) if other is not None else None
        if scaled is not None:
            found, step_range = scaled.profile, (scaled.low, scaled.high)
        source, basis = "estimated", f"scaled from {other.size.label()}" if other is not None else ""
    if found is not None and found.denoise_extra_bytes is not None:
        return KnownProfile(found, source, basis, basis, size, step_range)
    phases = estimate_phases(model, size)
    if found is not None:  # measured compute, activations not measured (a CPU): the config's estimate
        has = any(x is not None for x in (phases.text_extra, phases.denoise_extra, phases.decode_extra))
        return KnownProfile(_with_estimated_peaks(found, phases), source, BASIS if has else "", basis, size,
                            step_range)
    estimate = estimated_profile(plan, size, device, phases)
    if estimate is None:
        return KnownProfile(None, "unknown", "", "", size)
    return KnownProfile(estimate, "estimated", BASIS, BASIS if estimate.block_compute_s else "", size)
