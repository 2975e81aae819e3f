"""The planner's exhaustive search, kept as the oracle of the polynomial one (small models only).

Same rules, tried the slow way: every DiT candidate replayed (`stream_choice.evaluate`) and every
encoder/VAE combination planned (`make_plan`), then
- per combination: the fastest candidate that fits; among those within TIE of it the smallest peak,
  then the first in `candidates` order;
- across combinations: the fastest; among those within TIE of it, the largest encoders and VAEs kept
  resident first (the resident flags, ordered by size then name, compared as a sequence).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from omni_console.engine.planning.auto_plan import _zero_compute
from omni_console.engine.planning.plan import Plan, make_plan
from omni_console.engine.planning.request_forecast import dit_profile, phase_bytes
from omni_console.engine.planning.request_profile import RequestProfile
from omni_console.engine.planning.stream_choice import TIE, DitProfile, StreamChoice, candidates, evaluate
from omni_console.offload.policy import build_policy
from omni_console.offload.residency import PLACEMENTS


def choose_exhaustive(profile: DitProfile, bandwidth: float, fixed_bytes: int, budget: int | None,
                      placements: Sequence[str] = PLACEMENTS, phase_extra: int = 0
                      ) -> tuple[StreamChoice | None, StreamChoice]:
    every = [evaluate(profile, r, bandwidth, fixed_bytes, phase_extra) for r in candidates(len(profile.block_bytes))
             if r.placement in placements or not r.num_streamed]
    smallest = min(every, key=lambda c: c.peak_bytes)  # min keeps the first of equals
    fits = [c for c in every if budget is None or c.peak_bytes <= budget]
    if not fits:
        return None, smallest
    fastest = min(c.step_s for c in fits)
    return min((c for c in fits if c.step_s <= fastest * (1 + TIE)), key=lambda c: c.peak_bytes), smallest


def auto_plan_exhaustive(plan0: Plan, budget: int, profile: RequestProfile | None,
                         bandwidth: float | None) -> tuple[dict[str, bool], StreamChoice] | None:
    """(encoder/VAE name -> staged, the DiT's choice), or None when nothing fits."""
    aux = sorted((c.info for c in plan0.components if c.info.role in ("encoder", "vae") and c.info.has_weights),
                 key=lambda a: (-a.nbytes, a.name))
    extras = phase_bytes(profile)
    results = []
    for flags in itertools.product((True, False), repeat=len(aux)):
        plan = make_plan(plan0.model, build_policy({a.name: f for a, f in zip(aux, flags, strict=True)}, 0))
        dit = dit_profile(plan, profile) or _zero_compute(plan)
        enc = max((a.nbytes for a, f in zip(aux, flags, strict=True) if f and a.role == "encoder"), default=0)
        vae = max((a.nbytes for a, f in zip(aux, flags, strict=True) if f and a.role == "vae"), default=0)
        extra = max(enc + extras.text_extra, vae + extras.decode_extra)
        choice, _ = choose_exhaustive(dit, bandwidth or 1.0, plan.forecast.device_resident_bytes, budget,
                                      phase_extra=extra)
        if choice is not None:
            results.append((flags, choice))
    if not results:
        return None
    fastest = min(c.step_s for _, c in results)
    flags, choice = max(((f, c) for f, c in results if c.step_s <= fastest * (1 + TIE)),
                        key=lambda fc: tuple(not x for x in fc[0]))
    return {a.name: f for a, f in zip(aux, flags, strict=True)}, choice
