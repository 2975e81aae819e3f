"""`--ram-budget`: the plan's host items, their fixed share, and the tier planner's answer as the plan shows it.

Torch-free. A plan's host items (tier_cost.HostItem), indexed as `HostTiers` is (offload/tiers.py):
- every DiT/UNet block that the host keeps, by its index in `Plan.blocks` (execution order): the streamed ones
  (read every forward: hot), with two experts every block of both (the resident ones move at the switch: cold
  unless streamed), with live re-plan masters (the console) every block. Their bytes are as stored: with fp8
  storage (`--stream-dtype`, an fp8 checkpoint) the fp8 bytes, half a 16-bit checkpoint's, so fp8 storage halves
  what the budget must hold. A block the host does not keep is given "pinned" (no file tier to read);
- every staged encoder/VAE's master (with live re-plan masters: every encoder/VAE), by component name: cold.

`fixed_host_bytes` is what the host holds besides those, from the host forecast (engine/planning/host_forecast.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from ...offload.tiers import ALL_PINNED, HostTiers, Tier, TierRates
from ...offload.units import format_bytes, format_rate, format_seconds
from .host_forecast import host_forecast
from .plan import Plan
from .request_profile import RequestSize
from .tier_cost import HostItem, known_rates
from .tier_plan import TierChoice, choose_tiers

Key = tuple[Literal["block", "component"], int | str]


def host_items(plan: Plan, live: bool = False) -> tuple[list[HostItem], list[Key]]:
    """The host items of `plan` that a load can read from a file tier, and what each one is: the streamed
    blocks of a load with one DiT, and with live re-plan masters (the console) the resident ones too (cold:
    read only when a re-plan makes them resident). What the runtime keeps pinned whatever the tier
    (offload/tier_support.py: two experts' blocks, staged encoder/VAE masters, which read from their files only
    in a later change) is in the fixed share instead."""
    items: list[HostItem] = []
    keys: list[Key] = []
    if plan.experts:
        return items, keys
    for n, block in enumerate(plan.blocks):
        if block.streamed or live:
            items.append(HostItem(block.nbytes, hot=block.streamed))
            keys.append(("block", n))
    return items, keys


def fixed_host_bytes(plan: Plan, live: bool = False, size: RequestSize | None = None, on_cpu: bool = False) -> int:
    """The host peak outside the planned items: the host forecast (engine/planning/host_forecast.py) of `plan`
    with every item pinned, less the items' bytes."""
    items, _ = host_items(plan, live)
    pinned = replace(plan, tiers=ALL_PINNED)
    peak = host_forecast(pinned, size, live_replan=live, on_cpu=on_cpu).peak_bytes
    return max(0, peak - sum(i.nbytes for i in items))


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
             rate_notes: dict[str, str] | None = None, cap: int | None = None, size: RequestSize | None = None,
             on_cpu: bool = False) -> RamPlan:
    """The tiers of `plan`'s host items for `budget` (raises NothingFitsHost), `compute_s` one forward's compute
    (None: unknown), `rate_notes` how each rate was obtained ("measured", "cached", "unmeasured default")."""
    items, keys = host_items(plan, live)
    fixed = fixed_host_bytes(plan, live, size, on_cpu)
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
    lines.append(f"fixed host bytes {format_bytes(fixed)}: the host forecast without the file-tier candidates "
                 "(the process, its transients, and what stays pinned: staged masters"
                 + (", live re-plan masters" if live else "") + (", both experts' blocks" if plan.experts else "")
                 + ")")
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
