"""`--ram-budget`: the plan's host items, their fixed share, and the tier planner's answer as the plan shows it.

Torch-free. A plan's host items (tier_cost.HostItem), indexed as `HostTiers` is (offload/tiers.py):
- every DiT/UNet block that the host keeps, by its index in `Plan.blocks` (execution order): the streamed ones
  (read every forward: hot), with two experts every block of both (the resident ones move at the switch: cold
  unless streamed), with live re-plan masters (the console) every block. Their bytes are as stored: with fp8
  storage (`--stream-dtype`, an fp8 checkpoint) the fp8 bytes, half a 16-bit checkpoint's, so fp8 storage halves
  what the budget must hold. A block the host does not keep is given "pinned" (no file tier to read);
- every staged encoder/VAE's master (with live re-plan masters: every encoder/VAE), by component name: cold.

`fixed_host_bytes` is what the host holds besides those: the process itself and its transients, plus pinned bytes
the forecast counts beyond the masters (an encoder streamed layer by layer pins its layers a second time). The
lead replaces it by the host forecast (engine/planning/host_forecast.py) once merged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...offload.tiers import HostTiers, Tier, TierRates
from ...offload.units import format_bytes, format_rate, format_seconds
from .plan import Plan
from .tier_cost import HostItem, known_rates
from .tier_plan import TierChoice, choose_tiers

HOST_BASELINE = 1_500_000_000  # Python, torch, diffusers and the load's transients: the "no waste" margin
Key = tuple[Literal["block", "component"], int | str]


def host_items(plan: Plan, live: bool = False) -> tuple[list[HostItem], list[Key]]:
    """The host items of `plan` and what each one is (see the module docstring)."""
    items: list[HostItem] = []
    keys: list[Key] = []
    expert_of = {n: i for i, e in enumerate(plan.experts) for n in range(e.start, e.stop)}
    for n, block in enumerate(plan.blocks):
        if block.streamed or plan.experts or live:
            items.append(HostItem(block.nbytes, hot=block.streamed, forward=expert_of.get(n, 0)))
            keys.append(("block", n))
    for c in plan.components:
        aux = c.info.role in ("encoder", "vae") and c.info.has_weights
        if c.residency == "staged" or (live and aux and plan.policy.mode != "resident"):
            items.append(HostItem(c.info.nbytes, hot=False))
            keys.append(("component", c.info.name))
    return items, keys


def fixed_host_bytes(plan: Plan, live: bool = False) -> int:
    """The host bytes outside the planned items (see the module docstring)."""
    items, _ = host_items(plan, live)
    pinned = plan.forecast.pinned_host_bytes_live if live else plan.forecast.pinned_host_bytes
    return HOST_BASELINE + max(0, pinned - sum(i.nbytes for i in items))


@dataclass(frozen=True, slots=True)
class RamPlan:
    """The tiers chosen for a plan under `--ram-budget`, its figures and one line per decision."""

    tiers: HostTiers
    choice: TierChoice
    reasons: list[str]


def _tiers(plan: Plan, keys: list[Key], chosen: tuple[Tier, ...]) -> HostTiers:
    blocks: list[Tier] = ["pinned"] * len(plan.blocks)
    components: list[tuple[str, Tier]] = []
    for (kind, what), tier in zip(keys, chosen, strict=True):
        if kind == "block":
            assert isinstance(what, int)
            blocks[what] = tier
        else:
            components.append((str(what), tier))
    return HostTiers(tuple(blocks) if any(t != "pinned" for t in blocks) else (), tuple(components))


def _count_line(kind: str, tiers: list[tuple[Tier, int]]) -> str:
    def part(tier: Tier, label: str) -> str | None:
        sizes = [n for t, n in tiers if t == tier]
        return f"{len(sizes)} {label} ({format_bytes(sum(sizes))})" if sizes else None

    parts = [p for p in (part("pinned", "pinned"), part("page_cache", "from the page cache"),
                         part("disk", "from disk")) if p]
    spread = ", the file-tier ones spread evenly in execution order" if len(parts) > 1 else ""
    return f"{kind}: {len(tiers)} kept on the host: {', '.join(parts)}{spread}"


def ram_plan(plan: Plan, budget: int, rates: TierRates, compute_s: float | None = None, live: bool = False,
             rate_notes: dict[str, str] | None = None, cap: int | None = None) -> RamPlan:
    """The tiers of `plan`'s host items for `budget` (raises NothingFitsHost), `compute_s` one forward's compute
    (None: unknown), `rate_notes` how each rate was obtained ("measured", "cached", "unmeasured default")."""
    items, keys = host_items(plan, live)
    fixed = fixed_host_bytes(plan, live)
    choice = choose_tiers(items, budget, fixed, rates, compute_s, cap)
    tiers = _tiers(plan, keys, choice.tiers)
    cost, r, notes = choice.cost, known_rates(rates), rate_notes or {}
    lines = []
    note = getattr(budget, "note", "")
    if note:
        lines.append(note)
    lines.append(f"pin cap {format_bytes(choice.pin_cap)}: max(40 %, min(90 %, budget - 4 GiB)) of the budget "
                 "(ComfyUI's Linux rule: page-locked memory cannot be reclaimed, the kernel keeps room for the "
                 "page cache)")
    lines.append(f"fixed host bytes {format_bytes(fixed)}: the process and its transients"
                 + (f", {format_bytes(fixed - HOST_BASELINE)} pinned beyond the masters" if fixed > HOST_BASELINE
                    else ""))
    block_tiers = [(t, i.nbytes) for i, k, t in zip(items, keys, choice.tiers, strict=True) if k[0] == "block"]
    if block_tiers:
        fp8 = f" (stored {plan.stream_dtype}: half the host bytes)" if plan.stream_dtype else ""
        lines.append(_count_line(f"{plan.model.block_kind} blocks{fp8}", block_tiers))
    for (kind, name), item, tier in zip(keys, items, choice.tiers, strict=True):
        if kind == "component":
            lines.append(f"{name} master ({format_bytes(item.nbytes)}): {tier.replace('_', ' ')}")
    if cost.ring_bytes:
        lines.append(f"bounce ring: {format_bytes(cost.ring_bytes)} pinned, what the page-cache and disk tiers "
                     "read through")
    lines.append(f"host peak {format_bytes(cost.host_peak_bytes)} of {format_bytes(budget)} (pinned "
                 f"{format_bytes(cost.pinned_bytes + cost.ring_bytes)}; page cache "
                 f"{format_bytes(cost.page_cache_bytes)} is the kernel's, not the process's)")
    rate_text = ", ".join(f"{label} {format_rate(r.rate(tier))} ({notes.get(tier, 'unmeasured default')})"
                          for tier, label in (("pinned", "link"), ("page_cache", "page cache"), ("disk", "disk")))
    lines.append(f"predicted transfer per forward {format_seconds(cost.transfer_seconds)} = max(link "
                 f"{format_seconds(cost.link_seconds)}, files {format_seconds(cost.file_seconds)})"
                 + (f", step floor {format_seconds(choice.step_seconds)} with compute" if compute_s else "")
                 + f"; rates: {rate_text}")
    return RamPlan(tiers, choice, lines)
