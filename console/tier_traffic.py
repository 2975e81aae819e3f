"""What the host panel says about the host tiers: the bytes each tier holds as planned, the bytes staged from
each one since the load, and the read rate of the page cache and disk over the last seconds of staging events.

Fed by the plan (its `HostTiers`, offload/tiers.py) and by the staging events, whose `tier` says where a streamed
block's bytes came from (offload/tier_filler.py; a block the host refused to page-lock reads from the page
cache: offload/pin_fallback.py). Rates come from the events' own times, so they are the rate at which the ring
took those bytes during the request (what the step waited on), not a probe of the disk. No Textual here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..engine import events
from ..engine.api import Plan, planner
from ..offload.units import format_bytes, format_rate

WINDOW_S = 2.0
"""Seconds of staging events a read rate covers (its events' own times)."""
LABELS: dict[planner.Tier, str] = {"pinned": "pinned", "page_cache": "page cache", "disk": "disk"}


def planned_tier_bytes(plan: Plan) -> dict[planner.Tier, int]:
    """Bytes of the streamed blocks and staged masters per host tier, as `plan` places them."""
    held: dict[planner.Tier, int] = dict.fromkeys(planner.TIERS, 0)
    for i, block in enumerate(plan.blocks):
        if block.streamed:
            held[plan.tiers.block(i)] += block.nbytes
    for comp in plan.components:
        if comp.residency == "staged":
            held[plan.tiers.component(comp.info.name)] += comp.host_bytes
    return held


@dataclass
class TierTraffic:
    """The host panel's tier figures: `held` (planned bytes per tier), `read` (bytes staged from each tier since
    the load) and the recent events the read rates come from."""

    held: dict[planner.Tier, int] = field(default_factory=lambda: dict.fromkeys(planner.TIERS, 0))
    read: dict[planner.Tier, int] = field(default_factory=lambda: dict.fromkeys(planner.TIERS, 0))
    _recent: deque[tuple[float, planner.Tier, int]] = field(default_factory=deque)

    def show_plan(self, plan: Plan) -> None:
        self.held = planned_tier_bytes(plan)

    def add(self, batch: Iterable[events.Event]) -> bool:
        """Count the host→device staging events; True when any was counted."""
        counted = False
        for e in batch:
            if isinstance(e, events.StagingEvent) and e.direction == "h2d":
                self.read[e.tier] += e.nbytes
                self._recent.append((e.t, e.tier, e.nbytes))
                counted = True
        if self._recent:
            last = max(t for t, _, _ in self._recent)
            while self._recent and self._recent[0][0] < last - WINDOW_S:
                self._recent.popleft()
        return counted

    def rate(self, tier: planner.Tier) -> float | None:
        """Bytes per second staged from `tier` over the last `WINDOW_S` seconds of events (or the time since
        the first of them, when shorter); None before two events span any time."""
        if not self._recent:
            return None
        times = [t for t, _, _ in self._recent]
        span = min(WINDOW_S, max(times) - min(times))
        nbytes = sum(n for _, t, n in self._recent if t == tier)
        return nbytes / span if span > 0 and nbytes else None

    @property
    def uses_files(self) -> bool:
        """A page-cache or disk tier is planned or was read from (else the panel shows nothing of tiers)."""
        return any(self.held[t] or self.read[t] for t in ("page_cache", "disk"))


def tier_lines(traffic: TierTraffic) -> list[str]:
    """The host panel's tier lines: held per tier, read per tier, the file tiers' read rates."""
    def row(values: dict[planner.Tier, int]) -> str:
        return " · ".join(f"{LABELS[t]} {format_bytes(values[t])}" for t in planner.TIERS)

    rates = [f"{LABELS[t]} {format_rate(r)}" for t in ("page_cache", "disk") if (r := traffic.rate(t)) is not None]
    return [f"tiers    {row(traffic.held)}",
            f"read     {row(traffic.read)}",
            f"rate     {' · '.join(rates) if rates else 'no file-tier reads yet'} (last {WINDOW_S:g} s)"]
