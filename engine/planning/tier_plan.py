"""`--ram-budget`: choose each host item's tier (pinned, page cache, disk) for the fastest step within the budget.

Torch-free. The costs are tier_cost.py's. The search:
- the bounce rings' slots are sized by the largest file-tier block read or encoder layer (the shared ring: hot
  blocks, an expert's resident blocks read whole, a layer-streamed encoder's layers; `HostItem.shared_slot`) and
  the largest file-tier staged component's chunk (the staged components' ring; `HostItem.slot_basis`), so the
  candidates are every pair (largest shared slot L, largest file-tier chunk C), 0 meaning none: items larger
  than their bound are pinned, the others may be read from files;
- within a candidate: hot blocks are pinned first (largest first, then any smaller one that still fits: a pinned
  byte is never slower than a file byte and takes no more of the budget than the page cache would), then hot
  blocks go to the page cache while the kernel's share of the budget holds them (only if the page cache reads
  faster than O_DIRECT; else a page-cache byte is slower and costs memory, so none is chosen), then cold items
  the same way; the rest is read from disk;
- the hot blocks of one size that are read from files are spread evenly in execution order (and the disk ones
  evenly among them), so the ring, which copies k-1 blocks ahead, meets slow reads one at a time;
- the best candidate: the fastest step (max(compute, transfer)), then the fastest cold reads, then the
  smallest host peak.
First-fit by size is exact when a tier's blocks are all one size (a DiT's); otherwise it leaves less than one
block's bytes unused per tier (the tests hold it to that against an exhaustive search). Past `MAX_RING_SIZES`
distinct sizes (a UNet's units) only that many ring sizes are tried, so 4096 blocks plan in about a second.

Nothing fits when even every item's smallest tier leaves the fixed bytes and the ring over the budget (or the
pin cap): `NothingFitsHost` names the smallest possible host peak, exit 2, before load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...offload.tiers import Tier, TierRates
from ...offload.units import format_bytes
from ..errors import ConfigError
from .tier_cost import HostItem, TierCost, known_rates, pin_cap, rings_bytes, tier_cost

MAX_RING_SIZES = 32  # bounce-ring sizes tried per kind (hot, cold): every one up to this many distinct sizes


class NothingFitsHost(ConfigError):
    """No tier assignment keeps the host within `--ram-budget` (exit 2, before load)."""


@dataclass(frozen=True, slots=True)
class TierChoice:
    """The chosen tier per item, its figures, and the step it forecasts (seconds per forward)."""

    tiers: tuple[Tier, ...]
    cost: TierCost
    step_seconds: float
    budget: int
    pin_cap: int
    fixed: int


def step_seconds(cost: TierCost, compute_s: float | None) -> float:
    """One forward: max(compute, transfer); compute unknown counts as none (the transfer alone)."""
    return max(compute_s or 0.0, cost.transfer_seconds)


def _thinned(sizes: list[int]) -> list[int]:
    """At most MAX_RING_SIZES of the sorted `sizes`: all when few; else the largest quarter's worth and the
    rest spread evenly (a UNet's units come in hundreds of sizes; the search stays under a second)."""
    if len(sizes) <= MAX_RING_SIZES:
        return sizes
    top = MAX_RING_SIZES // 4
    rest = sizes[:-top]
    step = len(rest) / (MAX_RING_SIZES - top)
    return sorted({rest[int(j * step)] for j in range(MAX_RING_SIZES - top)} | set(sizes[-top:]))


def _candidates(items: Sequence[HostItem]) -> list[tuple[int, int]]:
    hot = _thinned(sorted({i.shared_slot for i in items} | {0}))
    cold = _thinned(sorted({i.slot_basis for i in items if not i.in_streamer_ring} | {0}))
    return [(h, c) for h in hot for c in cold]


def _forced(item: HostItem, hot_bound: int, cold_bound: int) -> bool:
    """Must be pinned under this candidate: larger than what the ring's slot may hold."""
    if item.in_streamer_ring:
        return item.slot_basis > hot_bound
    return item.slot_basis > cold_bound or item.layer_slot > hot_bound


def evenly(count: int, positions: Sequence[int]) -> list[int]:
    """`count` of `positions` spread evenly (the middle of each equal share)."""
    n = len(positions)
    return [positions[(2 * j + 1) * n // (2 * count)] for j in range(count)] if count else []


def _fill(sizes: dict[int, int], room: int) -> dict[int, int]:
    """How many of each size (count by size) fit in `room`, largest first, then any smaller that still fits."""
    taken: dict[int, int] = {}
    for size in sorted(sizes, reverse=True):
        n = min(sizes[size], room // size) if size else sizes[size]
        taken[size] = n
        room -= n * size
    return taken


def _assign(items: Sequence[HostItem], hot_bound: int, cold_bound: int, budget: int, cap: int, fixed: int,
            page_cache_first: bool) -> list[Tier] | None:
    """The candidate's assignment (see the module docstring), None when its forced pins do not fit."""
    ring = rings_bytes(hot_bound, cold_bound)
    tiers: list[Tier | None] = [None] * len(items)
    pinned = 0
    for n, item in enumerate(items):
        if _forced(item, hot_bound, cold_bound):
            tiers[n] = "pinned"
            pinned += item.nbytes
    pin_room = min(cap, budget - fixed) - ring - pinned
    if pin_room < 0:
        return None
    cache_room = budget - fixed - ring - pinned
    for hot in (True, False):
        free = [n for n, item in enumerate(items) if item.hot == hot and tiers[n] is None]
        groups: dict[int, list[int]] = {}
        for n in free:
            groups.setdefault(items[n].nbytes, []).append(n)
        pins = _fill({s: len(g) for s, g in groups.items()}, min(pin_room, cache_room))  # pinned bytes are budget too
        pin_room -= sum(s * k for s, k in pins.items())
        cache_room -= sum(s * k for s, k in pins.items())
        filed: dict[int, list[int]] = {}
        for s, g in groups.items():  # the file-tier ones spread evenly; the rest pinned
            spread = set(evenly(len(g) - pins[s], g))
            filed[s] = [n for n in g if n in spread]
            for n in g:
                if n not in spread:
                    tiers[n] = "pinned"
        reads: dict[int, list[int]] = {}  # the page cache holds what a read brings: regrouped by that
        for g in filed.values():
            for n in g:
                reads.setdefault(items[n].file_bytes, []).append(n)
        cached = _fill({s: len(g) for s, g in reads.items()}, cache_room) if page_cache_first else {}
        cache_room -= sum(s * k for s, k in cached.items())
        for s, g in reads.items():  # among them, the disk ones spread evenly
            disk = set(evenly(len(g) - cached.get(s, 0), sorted(g)))
            for n in g:
                tiers[n] = "disk" if n in disk else "page_cache"
    assert all(t is not None for t in tiers)
    return [t for t in tiers if t is not None]


def _key(cost: TierCost, compute_s: float | None) -> tuple[float, float, int]:
    return (step_seconds(cost, compute_s), cost.cold_seconds, cost.host_peak_bytes)


def smallest_peak(items: Sequence[HostItem], fixed: int) -> int:
    """The smallest host peak any assignment has: every item the ring may read from a file, the rest pinned (exact
    up to MAX_RING_SIZES distinct sizes per kind; past that, the smallest among the ring sizes tried)."""
    best = None
    for hot_bound, cold_bound in _candidates(items):
        forced = sum(i.nbytes for i in items if _forced(i, hot_bound, cold_bound))
        peak = fixed + forced + rings_bytes(hot_bound, cold_bound)
        best = peak if best is None else min(best, peak)
    return fixed if best is None else best


def _exact(n: int, other: int) -> str:
    """`n` as the plan writes sizes, or in bytes when that reads the same as `other`."""
    return format_bytes(n) if format_bytes(n) != format_bytes(other) else f"{n:,} bytes"


def choose_tiers(items: Sequence[HostItem], budget: int, fixed: int, rates: TierRates,
                 compute_s: float | None = None, cap: int | None = None) -> TierChoice:
    """The fastest assignment within `budget` host bytes (`fixed` of them already taken, `cap`: the pin cap,
    `pin_cap(budget)` by default); raises NothingFitsHost."""
    cap = pin_cap(budget) if cap is None else cap
    r = known_rates(rates)
    assert r.page_cache and r.disk
    pinned = tier_cost(items, ["pinned"] * len(items), rates, fixed)
    if pinned.fits(budget, cap, fixed):  # every item at its fastest tier: nothing to search
        return TierChoice(("pinned",) * len(items), pinned, step_seconds(pinned, compute_s), budget, cap, fixed)
    best: tuple[tuple[float, float, int], list[Tier], TierCost] | None = None
    for hot_bound, cold_bound in _candidates(items):
        tiers = _assign(items, hot_bound, cold_bound, budget, cap, fixed, r.page_cache > r.disk)
        if tiers is None:
            continue
        cost = tier_cost(items, tiers, rates, fixed)
        if not cost.fits(budget, cap, fixed):
            continue
        key = _key(cost, compute_s)
        if best is None or key < best[0]:
            best = (key, tiers, cost)
    if best is None:
        least = smallest_peak(items, fixed)
        raise NothingFitsHost(f"nothing fits in {_exact(budget, least)} of host memory: the smallest possible host "
                              f"peak is {_exact(least, budget)} ({format_bytes(fixed)} fixed: the process and its "
                              "transients; the rest: blocks and masters pinned where reading them through the "
                              f"bounce ring costs more, and the ring), with pinned memory capped at "
                              f"{format_bytes(cap)}")
    _, tiers, cost = best
    return TierChoice(tuple(tiers), cost, step_seconds(cost, compute_s), budget, cap, fixed)
