"""`--vram-budget`: choose the policy with the fastest predicted step whose predicted peak fits.

Knobs: each encoder/VAE staged or resident, the DiT's resident blocks, their placement and the
ring depth k. The DiT's streaming is chosen as `stream_choice.choose_streaming` does under what the
encoders and VAEs leave of the budget (counting the largest phase, so a staged VAE's decode must
fit too). Keeping one more of them resident never leaves more room, so the fastest step is the one
with all of them staged; every combination that leaves room for a candidate within 0.5 % of it is
equally fast, and among those the largest encoders and VAEs are kept resident first (each one, in
order of size, if it still fits): a greedy choice, linear in their number where trying every
combination doubled per component (fewest staged bytes exactly would be a knapsack problem). The
DiT's candidates are searched once (`stream_search.StreamTable`) and asked once per decision.
Without a profile the step time is the transfer time alone (compute unknown), which still prefers
keeping the most bytes resident, and the explanation says so.

The budget is the device memory of the process (NVML's per-process figure): the DiT and phases
are fitted into what torch may allocate once the CUDA context and a fragmentation margin are taken
off it (`device_footprint.DeviceOverhead`), and every peak shown is the process's.

Lean phases (engine/planning/lean.py) are chosen only when the budget needs them: those the policy sets "on"
always; of those left "auto", in `AUTO_LEAN` order, each while nothing fits without it, and streaming
the encoders (exact, nearly free) also when it leaves room for a faster step; any added one the
later ones make unnecessary is dropped again. Each in effect is a reason line with its phase's peak
before and after, its cost and whether the output stays bit-identical.

With fp8 storage the search is over pairs (streaming candidate, resident blocks kept upcast) and the
final choice among equally fast ones streams the fewest bytes (engine/planning/upcast_choice.py);
`upcast_resident` "off" keeps every resident block fp8.

If nothing fits even with every lean option, `NothingFits` names the smallest possible peak and each
phase's share of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ...offload.policy import LEAN_FIELDS, OffloadPolicy, build_policy
from ...offload.units import format_bytes
from ..errors import ConfigError
from ..model_dir.discovery import ComponentInfo
from .device_footprint import NO_OVERHEAD, DeviceOverhead, device_overhead
from .lean import LABELS, applicable, decode_geometry, encoder_stage_bytes, tiled_decode_extra
from .lora_cost import with_lora
from .plan import Plan, make_plan
from .profile_basis import profile_for
from .request_forecast import RequestForecast, dit_profile, forecast_request, phase_bytes
from .request_profile import RequestProfile, RequestSize
from .scale_bounds import Bounds
from .slack_config import slack_for
from .stream_choice import TIE, DitProfile, StreamChoice
from .stream_search import StreamTable
from .upcast_choice import Chooser, Pick, PlainChooser, UpcastChooser
from .upcast_cost import upcast_seconds

GB = 1e9
AUTO_LEAN = ("stream_encoders", "vae_tiling")  # what "auto" may choose, cheapest first (engine/planning/lean.py)
EXACT_LEAN = frozenset({"stream_encoders"})  # bit-identical and nearly free: also chosen to speed the step up


class NothingFits(ConfigError):
    """No policy's predicted peak fits the budget (exit 2, before load)."""


@dataclass(frozen=True, slots=True)
class AutoPlan:
    plan: Plan
    forecast: RequestForecast
    reasons: list[str]
    budget: int
    overhead: DeviceOverhead = NO_OVERHEAD  # the process's device memory outside torch's allocated bytes


def _gb(n: float) -> str:
    return format_bytes(int(n))


def _zero_compute(plan: Plan, activation_bytes: int = 0) -> DitProfile:
    blocks = plan.forward[0]  # one forward's (with two experts: one expert's)
    return DitProfile(tuple(b.nbytes for b in blocks), (0.0,) * len(blocks), 0.0, 1, activation_bytes)


def auto_plan(plan0: Plan, budget: int, size: RequestSize, profile: RequestProfile | None, source: str,
              bandwidth: float | None, bandwidth_source: str, overhead: DeviceOverhead = NO_OVERHEAD,
              peak_basis: str = "", step_basis: str = "", step_unknown: str = "") -> AutoPlan:
    """The best plan for `budget` bytes of the process (see the module docstring); raises NothingFits. The
    bases (profile_basis.KnownProfile) label the forecast and the reasons."""
    model, base = plan0.model, plan0.policy
    allocatable = overhead.allocated_budget(budget)
    if base.mode == "resident":
        raise ConfigError("--vram-budget chooses a DLO policy; it cannot be combined with --mode resident")
    aux = [c.info for c in plan0.components if c.info.role in ("encoder", "vae") and c.info.has_weights]
    extras = phase_bytes(profile)
    default = {k: v for k, v in base.dlo_offload_components.items() if k == "default"}
    staged_plan = with_lora(make_plan(model, _policy(base, {**default, **{a.name: True for a in aux}})),
                            plan0.lora_device_bytes)  # --lora's A/B take their room first
    dit = dit_profile(staged_plan, profile) or _zero_compute(staged_plan, extras.denoise_extra)
    # the DiT's candidates do not depend on the encoders and VAEs; a UNet's ring is budgeted in bytes
    table = StreamTable(dit, bandwidth or 1.0, byte_ring=staged_plan.residency.byte_ring)
    chooser = _chooser(staged_plan, table, profile)
    # every encoder/VAE staged, no resident block; with fp8 storage the running block's upcast scratch too
    fixed0 = staged_plan.forecast.device_resident_bytes + staged_plan.forecast.upcast_scratch_bytes
    geometry = decode_geometry(staged_plan, size)
    tiled_extra = extras.decode_extra if geometry is None else tiled_decode_extra(extras.decode_extra, *geometry)

    def phases(resident: frozenset[str], lean: frozenset[str]) -> tuple[int, int, int]:
        """(device weights outside the DiT's blocks, the text phase's and the decode phase's bytes above
        them) when `resident` encoders/VAEs stay on the device, the others staged, with `lean` phases."""
        streamed = "stream_encoders" in lean
        staged_enc = max((encoder_stage_bytes(a, streamed) for a in aux
                          if a.name not in resident and a.role == "encoder"), default=0)
        staged_vae = max((a.nbytes for a in aux if a.name not in resident and a.role == "vae"), default=0)
        kept = sum(a.nbytes for a in aux if a.name in resident)
        decode = tiled_extra if "vae_tiling" in lean else extras.decode_extra
        return fixed0 + kept, staged_enc + extras.text_extra, staged_vae + decode

    def above(resident: frozenset[str], lean: frozenset[str]) -> tuple[int, int]:
        """(device weights outside the DiT's blocks, the largest phase's bytes above the weights)."""
        fixed, text, decode = phases(resident, lean)
        return fixed, max(text, decode)

    def room(resident: frozenset[str], lean: frozenset[str]) -> int:
        """Bytes left for the DiT's resident blocks and slots (never more with one more resident)."""
        fixed, phase_extra = above(resident, lean)
        return allocatable - fixed - max(dit.activation_bytes, phase_extra)

    def fit(lean: frozenset[str]) -> tuple[Pick, frozenset[str]] | None:
        """(the DiT's candidate, the resident encoders/VAEs) with `lean` phases, or None if nothing fits."""
        fastest = chooser.choose(room(frozenset(), lean), TIE)  # keeping one more resident never leaves more room
        if fastest is None:
            return None
        need = chooser.room_of(fastest)  # as fast (within TIE) as it gets while the DiT needs this much room
        resident: frozenset[str] = frozenset()
        for a in sorted(aux, key=lambda a: (-a.nbytes, a.name)):  # the largest first (greedy)
            if room(resident | {a.name}, lean) >= need:
                resident = resident | {a.name}
        index = chooser.choose(room(resident, lean), TIE, "streamed")
        assert index is not None  # room(resident) >= need
        return index, resident

    lean, found = _choose_lean(base, staged_plan, fit, chooser)
    if found is None:
        least = int(table.room[table.least_room()])
        every = frozenset(n for n, m in lean_modes(base).items() if m != "off" and applicable(staged_plan, n))
        fixed, text, decode = phases(frozenset(), every)
        peaks = {"text encoding": fixed + least + text, "denoise": fixed + least + dit.activation_bytes,
                 "VAE decode": fixed + least + decode}
        shown = [LABELS[n] for n in LEAN_FIELDS if n in every and n in AUTO_LEAN]
        raise NothingFits(f"nothing fits in {_gb(budget)}: the smallest possible peak is "
                          f"{_gb(overhead.process_bytes(max(peaks.values())))} of the process (every block streamed "
                          f"through "
                          f"{'2 slots' if dit.block_bytes else 'no slots'}, every encoder and VAE staged"
                          f"{''.join(', ' + s for s in shown)}; by phase: "
                          f"{', '.join(f'{k} {_gb(v)}' for k, v in peaks.items())}"
                          f"{'' if profile else '; activations not measured yet, so the real peak is higher'}"
                          f"{'' if overhead is NO_OVERHEAD else '; ' + overhead.describe()})")
    index, resident = found
    choice = chooser.evaluate(index, *above(resident, lean))
    policy = _policy(base, {**default, **{a.name: a.name not in resident for a in aux}}, lean)
    chosen = policy.model_copy(update=dict(resident_layers=choice.residency.num_resident,
                                           placement=choice.residency.placement,
                                           prefetch_slots=max(choice.residency.slots, 2),
                                           upcast_resident=index.upcast or _no_upcast(base)))
    tried: dict[str, float | None] = {}  # each encoder/VAE's other state: its step time, None if nothing fits
    for a in aux:
        alt = chooser.choose(room(resident ^ {a.name}, lean), TIE)
        tried[a.name] = None if alt is None else chooser.step(alt)
    plan = with_lora(make_plan(model, chosen), plan0.lora_device_bytes)
    forecast = forecast_request(plan, size, profile, source, bandwidth, bandwidth_source,  # type: ignore[arg-type]
                                peak_basis=peak_basis, step_basis=step_basis)
    forecast = replace(forecast, overhead=overhead if overhead is not NO_OVERHEAD else None)
    known = profile is not None and bool(profile.block_compute_s)
    reasons = _reasons(plan, choice, aux, tried, budget, profile if known else None, bandwidth, overhead,
                       step_basis if step_basis not in ("", "cached") else "", step_unknown)
    if plan.stream_dtype is not None and choice.residency.num_resident:
        reasons.insert(-1, _upcast_reason(plan, chooser, index, base))
    reasons[-1:-1] = [c.line for c in forecast.lean]
    spare = [LABELS[n] for n in AUTO_LEAN if lean_modes(base)[n] == "auto" and n not in lean and applicable(plan, n)]
    if spare:
        reasons.insert(-1, f"lean phases: none needed beyond the above ({', '.join(spare)} only if the budget "
                           "needs them)" if forecast.lean else
                           f"lean phases: none needed ({', '.join(spare)} only if the budget needs them)")
    return AutoPlan(plan, forecast, reasons, budget, overhead)


def lean_modes(base: OffloadPolicy) -> dict[str, str]:
    """Each lean phase's mode as the operator set it: one an earlier budget turned on is "auto" again."""
    return {n: "auto" if n in base.lean_auto else getattr(base, n) for n in LEAN_FIELDS}


def _policy(base: OffloadPolicy, components: dict[str, bool], lean: frozenset[str] = frozenset()) -> OffloadPolicy:
    """A policy with `components`, the base's storage, and the lean phases `lean` on (the others as the
    operator set them: "auto" stays "auto", so a later budget may still choose them)."""
    modes = lean_modes(base)
    chosen = tuple(n for n in LEAN_FIELDS if n in lean and modes[n] == "auto")
    return build_policy(components, 0, "dlo", "leading", 2, stream_dtype=base.stream_dtype,
                        fp8_modulation=base.fp8_modulation, upcast_resident=base.upcast_resident,
                        **{n: "on" if n in lean else m for n, m in modes.items()}, lean_auto=chosen)


def _chooser(plan: Plan, table: StreamTable, profile: RequestProfile | None) -> Chooser:
    """With fp8 storage and a measured profile (one DiT, no experts): the search over kept-upcast resident
    blocks too (engine/planning/upcast_choice.py; with `upcast_resident` "off" none is kept, the fewest-bytes
    tie-break stays); else the table's own choice."""
    blocks = plan.forward[0]
    if (plan.stream_dtype is None or plan.experts or profile is None or not profile.block_compute_s
            or not any(b.upcast_elems for b in blocks)):
        return PlainChooser(table)
    off = plan.policy.upcast_resident == "off"
    upcast = (0.0,) * len(blocks) if off else upcast_seconds([b.upcast_elems for b in blocks], profile.device)
    return UpcastChooser(table, upcast, [b.upcast_extra_bytes for b in blocks])


def _no_upcast(base: OffloadPolicy) -> str | int:
    """The policy's `upcast_resident` when the budget keeps no block upcast: "off" stays, else 0 (or "auto")."""
    return base.upcast_resident if isinstance(base.upcast_resident, str) else 0


def _upcast_reason(plan: Plan, chooser: Chooser, pick: Pick, base: OffloadPolicy) -> str:
    """One line: how many resident fp8 blocks are kept upcast, what it costs and saves, or why none."""
    n = pick.upcast
    resident = plan.residency.num_resident
    if base.upcast_resident == "off":
        return f"fp8 resident blocks: all {resident} upcast per forward (--upcast-resident off)"
    if not isinstance(chooser, UpcastChooser):  # nothing measured to weigh the upcast against
        return (f"fp8 resident blocks: all {resident} stay fp8, upcast per forward (kept upcast is weighed once a "
                "request has been profiled)")
    if n == 0:
        return (f"fp8 resident blocks: all {resident} stay fp8, upcast per forward (keeping them upcast would not "
                "fit or not speed the step)")
    extra = sum(b.device_bytes - b.nbytes for b in plan.blocks if b.kept_upcast)
    saved = chooser.step(Pick(pick.index)) - chooser.step(pick)
    return (f"fp8 resident blocks: {n} of {resident} kept upcast (the first ones; +{_gb(extra)}), "
            f"{saved * 1e3:.1f} ms a step less upcast")


def _choose_lean(base: OffloadPolicy, plan: Plan, fit: Callable[[frozenset[str]], tuple[Pick, frozenset[str]] | None],
                 table: Chooser) -> tuple[frozenset[str], tuple[Pick, frozenset[str]] | None]:
    """The lean phases the budget needs: those set "on", plus each "auto" one (`AUTO_LEAN`, in order)
    while nothing fits, or (streaming encoders: exact and nearly free) while it makes the step faster;
    then every added one that the others make unnecessary is dropped again."""
    modes = lean_modes(base)
    lean = frozenset(n for n in LEAN_FIELDS if modes[n] == "on")
    found = fit(lean)
    added: list[str] = []
    for name in AUTO_LEAN:
        if modes[name] != "auto" or not applicable(plan, name):
            continue
        if found is not None and name not in EXACT_LEAN:
            continue
        trial = fit(lean | {name})
        if found is None or (trial is not None and table.step(trial[0]) < table.step(found[0]) * (1 - TIE)):
            lean, found = lean | {name}, trial
            added.append(name)
    for name in reversed(added):
        trial = fit(lean - {name})
        if found is not None and trial is not None and table.step(trial[0]) <= table.step(found[0]) * (1 + TIE):
            lean, found = lean - {name}, trial
    return lean, found


def _reasons(plan: Plan, choice: StreamChoice, aux: list[ComponentInfo],
             tried: dict[str, float | None], budget: int, profile: RequestProfile | None,
             bandwidth: float | None, overhead: DeviceOverhead = NO_OVERHEAD, basis: str = "",
             step_unknown: str = "") -> list[str]:
    """One line per decision: each encoder/VAE (and what the other choice would have cost), the DiT's
    resident blocks and placement, the ring, and the predicted step and peak with what they rest on."""
    lines: list[str] = []
    r = choice.residency
    # a step time needs measured compute and, if anything streams, the link's rate; else it is unknown
    known = profile is not None and (bool(bandwidth) or r.num_streamed == 0) and not step_unknown
    for a in aux:
        staged = plan.policy.offload_enabled(a.name)
        alt = tried.get(a.name)
        state = "staged" if staged else "resident"
        if alt is None:
            why = "resident would not fit" if staged else "staged would not fit"
        elif staged and not known:  # ranked by bytes streamed: a time would be invented
            why = (f"resident would leave room for fewer resident {plan.model.block_kind} blocks"
                   if alt > choice.step_s * (1 + TIE) else "resident streams no fewer bytes and needs more room")
        elif staged:
            why = f"resident would slow the step to {alt:.3f} s" if alt > choice.step_s * (1 + TIE) \
                else "resident is no faster and needs more room"
        else:
            why = "fits without slowing the step (saves staging it every request)"
        lines.append(f"{a.name} ({_gb(a.nbytes)}): {state}, {why}")
    where = "the leading ones (vLLM-Omni's resident_layers)" if r.placement == "leading" else \
        "spread evenly so each streamed block's copy hides behind resident compute"
    if r.num_streamed == 0:
        lines.append(f"{plan.model.block_kind}: all {r.num_blocks} blocks resident (nothing streams)")
    else:
        lines.append(f"{plan.model.block_kind}: {r.num_resident} of {r.num_blocks} blocks resident, {where}")
        lines.append(f"prefetch ring: {r.slots} slot{'s' if r.slots != 1 else ''} "
                     f"({_gb(choice.slot_bytes)}), copies run up to {max(r.slots - 1, 0)} block(s) ahead")
    if known:
        floor = choice.forward.floor_s * (profile.forwards_per_step if profile else 1)
        step = f"predicted step {choice.step_s:.3f} s (floor {floor:.3f} s)"
        basis = basis or "from the measured profile"
    else:
        step = "predicted step unknown"
        basis = ("ranked by bytes streamed per step (no request of this model has run on this device yet: run one)"
                 if profile is None else f"ranked by bytes streamed per step ({step_unknown})" if step_unknown
                 else "ranked by bytes streamed per step (the link's rate is not known yet)")
    if overhead is NO_OVERHEAD:
        lines.append(f"{step}, peak {_gb(choice.peak_bytes)} of {_gb(budget)}; {basis}")
    else:
        slack = slack_for(profile, plan)  # measured by a request of this size under this plan only
        process = overhead.process_bytes(choice.peak_bytes, slack, budget)
        lines.append(f"{step}, device memory of the process {_gb(process)} "
                     f"of {_gb(budget)} (allocated peak {_gb(choice.peak_bytes)}); {basis}")
        lines.append(f"outside torch's allocations: {overhead.describe(choice.peak_bytes, slack)}")
    note = getattr(budget, "note", "")
    if note:
        lines.insert(0, note)
    return lines


def auto_plan_for(plan0: Plan, budget: int, size: RequestSize, device: str,
                  observed_bandwidth: float | None = None) -> AutoPlan:
    """`auto_plan` with what is known on `device` (`profile_for`, the device's footprint); the link rate
    given, else the profile's."""
    known = profile_for(plan0, size, device)
    profile = known.profile
    bandwidth = observed_bandwidth or (profile.bandwidth_bytes_per_s if profile else None)
    bw_source = "measured" if observed_bandwidth else "cached" if known.step_basis == "cached" else "estimated"
    unknown = ""
    if known.step_range is not None:  # the scaled compute's ends too far apart to rank by time (scale_bounds)
        low, high = (sum(p.block_compute_s) + p.other_s for p in known.step_range)
        if not Bounds(low, high).known:
            unknown = f"the step time is unknown until measured at this size ({known.step_basis} it may be fixed work)"
    return auto_plan(plan0, budget, known.size, profile, known.source, bandwidth, bw_source, device_overhead(device),
                     known.peak_basis, known.step_basis, unknown)
