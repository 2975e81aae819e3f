"""`--ram-budget` after `--vram-budget`: the host tiers of the plan the device budget chose, with what is known.

Torch-free. The device plan comes first (it decides which blocks stream, which encoders are staged or streamed
layer by layer: the host items and their fixed share follow from it, ram_plan.py); then the tiers, at the link
rate and compute of the request profile (profile_basis.profile_for) and the page cache's and disk's rates of the
checkpoint's file system (tier_rates.py, probed once and cached).
"""

from __future__ import annotations

from dataclasses import replace

from ...offload.units import format_seconds
from .plan import Plan
from .profile_basis import profile_for
from .ram_plan import RamPlan, ram_plan
from .request_profile import RequestSize
from .tier_rates import measured_rates, tier_rates


def ram_plan_for(plan: Plan, budget: int, size: RequestSize, device: str, live: bool = False,
                 bandwidth: float | None = None) -> tuple[Plan, RamPlan]:
    """`plan` with the tiers chosen for `budget` host bytes (raises NothingFitsHost), and the choice. `live`:
    the load keeps every master for a live re-plan (the console, `run --vram-budget`)."""
    notes: list[str] = []
    known = profile_for(plan, size, device)
    profile = known.profile
    link = bandwidth or (profile.bandwidth_bytes_per_s if profile else None)
    link_source = "measured" if bandwidth else "cached" if link else "unmeasured default"
    files = [f for c in plan.model.components for f in c.files]
    cached = measured_rates(plan.model.path, device, notes, files=files)
    rates, said = tier_rates(cached, link, link_source)
    compute = None
    if profile is not None and profile.block_compute_s:
        compute = sum(profile.block_compute_s) + profile.other_s
    chosen = ram_plan(plan, budget, rates, compute, live, said, size=size, on_cpu=device.startswith("cpu"))
    if compute is not None and profile is not None:
        fps = profile.forwards_per_step
        cost = chosen.choice.cost
        step, work = format_seconds(chosen.choice.step_seconds * fps), format_seconds(compute * fps)
        chosen.reasons.append(f"predicted step floor with the host tiers {step} = max(compute {work}, transfer "
                              f"{format_seconds(cost.transfer_seconds * fps)}) over {fps} forward(s) a step")
    if cached is not None and cached.note:
        chosen.reasons.append(f"tier rates: {cached.note}")
    chosen.reasons.extend(notes)
    return replace(plan, tiers=chosen.tiers), chosen
