"""`--ram-budget`: the plan's host items, their fixed share, and the tier planner's answer as the plan shows it.

Torch-free. A plan's host items (tier_cost.HostItem), indexed as `HostTiers` is (offload/tiers.py):
- every DiT/UNet block that the host keeps, by its index in `Plan.blocks` (execution order): the streamed ones
  (read every forward: hot), with two experts every block of both, the second expert's after the first's as
  the streamer runs them (an expert's resident ones are read once at each switch to it: cold, so the idle
  expert need not be pinned), with live re-plan masters (the console) every block (the resident ones cold: read
  when a re-plan makes them resident). Their bytes are as stored: with fp8 storage (`--stream-dtype`, an fp8
  checkpoint) the fp8 bytes, half a 16-bit checkpoint's, so fp8 storage halves what the budget must hold
  pinned; a page-cache or disk read brings the file's bytes (`HostItem.file_bytes`: a 16-bit checkpoint's,
  twice the fp8 ones; an fp8 checkpoint's, the same). A block the host does not keep is given "pinned";
- every staged encoder/VAE (not with live re-plan masters: the console keeps every encoder/VAE's), by component
  name: cold (read once per stage from a file tier: offload/file_stager.py, offload/layer_stage.py).

`fixed_host_bytes` is what the host holds besides those, from the host forecast (engine/planning/host_forecast.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from ...offload.tiers import ALL_PINNED, HostTiers, Tier, TierRates
from ...offload.units import format_bytes, format_rate, format_seconds
from .host_forecast import host_forecast, layer_slot, read_whole_at_load, stage_chunk
from .plan import Plan
from .request_profile import RequestSize
from .tier_cost import HostItem, known_rates
from .tier_plan import NothingFitsHost, TierChoice, choose_tiers

Key = tuple[Literal["block", "component"], int | str]


def host_items(plan: Plan, live: bool = False) -> tuple[list[HostItem], list[Key]]:
    """The host items of `plan` that a load can read from a file tier, and what each one is: the streamed
    blocks of a load with one DiT; with live re-plan masters (the console) the resident ones too (cold: read
    whole only when a re-plan makes them resident, offload/streamer.py `_make_resident`); with two experts every
    block of both, each read by its own expert's forwards (its resident ones cold: read once at each switch to
    it); and, without live re-plan masters, its staged encoders/VAEs (cold: read once per stage; a layer-streamed
    encoder a layer per bounce slot). What the runtime keeps pinned whatever the tier (the console's
    encoder/VAE masters) is in the fixed share instead."""
    items: list[HostItem] = []
    keys: list[Key] = []
    expert_of = {n: i for i, e in enumerate(plan.experts) for n in range(e.start, e.stop)}
    for n, block in enumerate(plan.blocks):
        if block.streamed or live or n in expert_of:
            items.append(HostItem(block.nbytes, hot=block.streamed, forward=expert_of.get(n, 0),
                                  read_nbytes=block.file_nbytes, whole=True))
            keys.append(("block", n))
    return (items, keys) if live else staged_items(plan, items, keys)


def staged_items(plan: Plan, items: list[HostItem], keys: list[Key]) -> tuple[list[HostItem], list[Key]]:
    """`items` and `keys` with each staged encoder/VAE added (cold: read once per stage from a file tier)."""
    for c in plan.components:
        if c.residency == "staged" and c.info.has_weights:
            items.append(HostItem(c.info.nbytes, hot=False, chunk=stage_chunk(plan, c.info),
                                  layer_slot=layer_slot(plan, c.info)))
            keys.append(("component", c.info.name))
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


def _check_load_phase(plan: Plan, tiers: HostTiers, budget: int, size: RequestSize | None, live: bool,
                      on_cpu: bool) -> None:
    """The load phase holds what the tier planner's peak does not see: the largest component read into host memory
    before it moves to the device (a resident one, a DiT's non-block layers, a file-tier encoder/VAE that cannot be
    built over its files: host_forecast.load_buffer_bytes) on top of the pinned set. A load phase over the budget is
    refused (NothingFitsHost) rather than run over it."""
    forecast = host_forecast(replace(plan, tiers=tiers), size, live_replan=live, on_cpu=on_cpu)
    load = forecast.phase_peaks["load"]
    if load <= budget:
        return
    buffers = forecast.part("load read buffers")
    whole = read_whole_at_load(replace(plan, tiers=tiers))
    what = (f"an encoder/VAE its library reads whole once as it is built ({whole[0].name}, "
            f"{format_bytes(max(i.nbytes for i in whole))})" if whole and buffers == max(i.nbytes for i in whole)
            else f"the largest component read to the host before it moves to the device ({format_bytes(buffers)})")
    raise NothingFitsHost(f"nothing fits in {format_bytes(budget)} of host memory while loading: the load peaks at "
                          f"{format_bytes(load)} with {what} on top of {format_bytes(load - buffers)} held")


def _block_groups(plan: Plan) -> list[tuple[str, list[tuple[int, int]]]]:
    """The plan's blocks as its decision lines group them: one line per expert (the idle one's tier is what a
    small host needs to see), else one."""
    kind = plan.model.block_kind
    if plan.experts:
        return [(f"{e.name} ({'first' if i == 0 else 'second'} expert) {kind} blocks", [(e.start, e.stop)])
                for i, e in enumerate(plan.experts)]
    return [(f"{kind} blocks", [(0, len(plan.blocks))])]


def _switch_reads(plan: Plan, items: list[HostItem], tiers: tuple[Tier, ...], rates: TierRates) -> list[str]:
    """Per expert: what a switch to it reads from files (its resident blocks in the page cache or on disk) and
    how long at the tiers' rates; its first blocks are read ahead during the forward before it."""
    lines = []
    for i, e in enumerate(plan.experts):
        filed = [(item, t) for item, t in zip(items, tiers, strict=True)
                 if item.forward == i and not item.hot and t != "pinned"]
        if filed:
            seconds = sum(max(item.file_bytes / (rates.rate(t) or 1.0), item.nbytes / (rates.link or 1.0))
                          for item, t in filed)
            read = format_bytes(sum(item.file_bytes for item, _ in filed))
            lines.append(f"a switch to {e.name} reads its {len(filed)} resident blocks from files ({read}, about "
                         f"{format_seconds(seconds)}; the first ones read ahead during the forward before it)")
    return lines


def ram_plan(plan: Plan, budget: int, rates: TierRates, compute_s: float | None = None, live: bool = False,
             rate_notes: dict[str, str] | None = None, cap: int | None = None, size: RequestSize | None = None,
             on_cpu: bool = False) -> RamPlan:
    """The tiers of `plan`'s host items for `budget` (raises NothingFitsHost), `compute_s` one forward's compute
    (None: unknown), `rate_notes` how each rate was obtained ("measured", "cached", "unmeasured default")."""
    items, keys = host_items(plan, live)
    fixed = fixed_host_bytes(plan, live, size, on_cpu)
    choice = choose_tiers(items, budget, fixed, rates, compute_s, cap)
    tiers = _tiers(plan, keys, choice.tiers)
    _check_load_phase(plan, tiers, budget, size, live, on_cpu)
    cost, r, notes = choice.cost, known_rates(rates), rate_notes or {}
    lines = []
    note = getattr(budget, "note", "")
    if note:
        lines.append(note)
    lines.append(f"pin cap {format_bytes(choice.pin_cap)}: max(40 %, min(90 %, budget - 4 GiB)) of the budget "
                 "(ComfyUI's Linux rule: page-locked memory cannot be reclaimed, the kernel keeps room for the "
                 "page cache)")
    lines.append(f"fixed host bytes {format_bytes(fixed)}: the host forecast without the file-tier candidates "
                 "(the process and its transients"
                 + (", and what stays pinned: the encoder/VAE masters a live re-plan keeps" if live else "") + ")")
    fp8 = f" (stored {plan.stream_dtype}: half the host bytes)" if plan.stream_dtype else ""
    for label, spans in _block_groups(plan):
        block_tiers = [(t, i.nbytes) for i, k, t in zip(items, keys, choice.tiers, strict=True)
                       if k[0] == "block" and any(a <= int(k[1]) < b for a, b in spans)]
        if block_tiers:
            lines.append(_count_line(f"{label}{fp8}", block_tiers))
    for (kind, name), item, tier in zip(keys, items, choice.tiers, strict=True):
        if kind == "component" and tier == "pinned":
            lines.append(f"{name} master ({format_bytes(item.nbytes)}): pinned")
        elif kind == "component":
            rate = min(r.rate(tier) or 1.0, r.link or 1.0)
            lines.append(f"{name} ({format_bytes(item.nbytes)}): {tier.replace('_', ' ')}, no host master; each "
                         f"stage reads it in about {format_seconds(item.nbytes / rate)} at {format_rate(rate)}")
    lines.extend(_switch_reads(plan, items, choice.tiers, r))
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
