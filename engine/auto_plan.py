"""`--vram-budget`: choose the policy with the fastest predicted step whose predicted peak fits.

Knobs: each encoder/VAE staged or resident, the DiT's resident blocks, their placement and the
ring depth k. For every encoder/VAE combination the DiT's streaming is chosen by
`stream_choice.choose_streaming` under what the combination leaves of the budget (counting the
largest phase, so a staged VAE's decode must fit too). The winner is the fastest; among equally
fast ones (0.5 %), the one that stages fewer bytes per request, then the smaller peak. Without a
profile the step time is the transfer time alone (compute unknown), which still prefers keeping
the most bytes resident, and the explanation says so.

If nothing fits, `NothingFits` names the smallest possible peak.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..offload.errors import ConfigError
from ..offload.policy import OffloadPolicy, build_policy
from ..offload.units import format_bytes
from .discovery import ComponentInfo
from .plan import Plan, make_plan
from .request_forecast import RequestForecast, dit_profile, forecast_request, known_profile, phase_bytes
from .request_profile import RequestProfile, RequestSize
from .stream_choice import TIE, DitProfile, StreamChoice, choose_streaming

GB = 1e9


class NothingFits(ConfigError):
    """No policy's predicted peak fits the budget (exit 2, before load)."""


@dataclass(frozen=True, slots=True)
class AutoPlan:
    plan: Plan
    forecast: RequestForecast
    reasons: list[str]
    budget: int


def _gb(n: float) -> str:
    return format_bytes(int(n))


def _zero_compute(plan: Plan) -> DitProfile:
    return DitProfile(tuple(b.nbytes for b in plan.blocks), (0.0,) * len(plan.blocks), 0.0, 1, 0)


def auto_plan(plan0: Plan, budget: int, size: RequestSize, profile: RequestProfile | None, source: str,
              bandwidth: float | None, bandwidth_source: str) -> AutoPlan:
    """The best plan for `budget` bytes (see the module docstring); raises NothingFits."""
    model, base = plan0.model, plan0.policy
    if base.mode == "resident":
        raise ConfigError("--vram-budget chooses a DLO policy; it cannot be combined with --mode resident")
    aux = [c.info for c in plan0.components if c.info.role in ("encoder", "vae") and c.info.has_weights]
    extras = phase_bytes(profile)
    bw = bandwidth or 1.0
    best: tuple[StreamChoice, int, OffloadPolicy] | None = None
    smallest: int | None = None
    tried: dict[tuple[bool, ...], StreamChoice | None] = {}
    for flags in itertools.product((True, False), repeat=len(aux)):
        comps = {**{k: v for k, v in base.dlo_offload_components.items() if k == "default"},
                 **{a.name: f for a, f in zip(aux, flags, strict=True)}}
        policy = build_policy(comps, 0, "dlo", "leading", 2)
        plan = make_plan(model, policy)
        dit = dit_profile(plan, profile) or _zero_compute(plan)
        staged_enc = max((a.nbytes for a, f in zip(aux, flags, strict=True) if f and a.role == "encoder"), default=0)
        staged_vae = max((a.nbytes for a, f in zip(aux, flags, strict=True) if f and a.role == "vae"), default=0)
        phase_extra = max(staged_enc + extras.text_extra, staged_vae + extras.decode_extra)
        fixed = plan.forecast.device_resident_bytes  # no resident blocks in this plan: components + non-block
        choice, least = choose_streaming(dit, bw, fixed, budget, phase_extra=phase_extra)
        smallest = least.peak_bytes if smallest is None else min(smallest, least.peak_bytes)
        tried[flags] = choice
        if choice is None:
            continue
        staged = sum(a.nbytes for a, f in zip(aux, flags, strict=True) if f)
        chosen = policy.model_copy(update=dict(resident_layers=choice.residency.num_resident,
                                               placement=choice.residency.placement,
                                               prefetch_slots=max(choice.residency.slots, 2)))
        if best is None or choice.step_s < best[0].step_s * (1 - TIE) or (
                choice.step_s <= best[0].step_s * (1 + TIE)
                and (staged, choice.peak_bytes) < (best[1], best[0].peak_bytes)):
            best = (choice, staged, chosen)
    if best is None:
        raise NothingFits(f"nothing fits in {_gb(budget)}: the smallest possible peak is {_gb(smallest or 0)} "
                          f"(every block streamed through 2 slots, every encoder and VAE staged"
                          f"{'' if profile else '; activations not measured yet, so the real peak is higher'})")
    choice, _, policy = best
    plan = make_plan(model, policy)
    forecast = forecast_request(plan, size, profile, source, bandwidth, bandwidth_source)  # type: ignore[arg-type]
    return AutoPlan(plan, forecast, _reasons(plan, choice, aux, tried, budget, profile, bandwidth), budget)


def _reasons(plan: Plan, choice: StreamChoice, aux: list[ComponentInfo],
             tried: dict[tuple[bool, ...], StreamChoice | None], budget: int, profile: RequestProfile | None,
             bandwidth: float | None) -> list[str]:
    """One line per decision: each encoder/VAE (and what the other choice would have cost), the DiT's
    resident blocks and placement, the ring, and the predicted step and peak with what they rest on."""
    lines: list[str] = []
    r = choice.residency
    # a step time needs measured compute and, if anything streams, the link's rate; else it is unknown
    known = profile is not None and (bool(bandwidth) or r.num_streamed == 0)
    flags = tuple(plan.policy.offload_enabled(a.name) for a in aux)
    for i, a in enumerate(aux):
        other = tuple(not f if j == i else f for j, f in enumerate(flags))
        alt = tried.get(other)
        state = "staged" if flags[i] else "resident"
        if alt is None:
            why = "resident would not fit" if flags[i] else "staged would not fit"
        elif flags[i] and not known:  # ranked by bytes streamed: a time would be invented
            why = "resident would leave room for fewer resident DiT blocks" if alt.step_s > choice.step_s * (1 + TIE) \
                else "resident streams no fewer bytes and needs more room"
        elif flags[i]:
            why = f"resident would slow the step to {alt.step_s:.3f} s" if alt.step_s > choice.step_s * (1 + TIE) \
                else "resident is no faster and needs more room"
        else:
            why = "fits without slowing the step (saves staging it every request)"
        lines.append(f"{a.name} ({_gb(a.nbytes)}): {state}, {why}")
    where = "the leading ones (vLLM-Omni's resident_layers)" if r.placement == "leading" else \
        "spread evenly so each streamed block's copy hides behind resident compute"
    if r.num_streamed == 0:
        lines.append(f"DiT: all {r.num_blocks} blocks resident (nothing streams)")
    else:
        lines.append(f"DiT: {r.num_resident} of {r.num_blocks} blocks resident, {where}")
        lines.append(f"prefetch ring: {r.slots} slot{'s' if r.slots != 1 else ''} "
                     f"({_gb(choice.slot_bytes)}), copies run up to {max(r.slots - 1, 0)} block(s) ahead")
    if known:
        floor = choice.forward.floor_s * (profile.forwards_per_step if profile else 1)
        step = f"predicted step {choice.step_s:.3f} s (floor {floor:.3f} s)"
        basis = "from the measured profile"
    else:
        step = "predicted step unknown"
        basis = ("ranked by bytes streamed per step (no request of this model has run on this device yet: run one)"
                 if profile is None else "ranked by bytes streamed per step (the link's rate is not known yet)")
    lines.append(f"{step}, peak {_gb(choice.peak_bytes)} of {_gb(budget)}; {basis}")
    return lines


def auto_plan_for(plan0: Plan, budget: int, size: RequestSize, device: str,
                  observed_bandwidth: float | None = None) -> AutoPlan:
    """`auto_plan` with what is known on `device` (`known_profile`); the link rate given, else cached."""
    profile, source = known_profile(plan0, size, device)
    bandwidth = observed_bandwidth or (profile.bandwidth_bytes_per_s if profile else None)
    bw_source = "measured" if observed_bandwidth else "cached"
    return auto_plan(plan0, budget, size, profile, source, bandwidth, bw_source)
