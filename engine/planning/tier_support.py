"""Which loads can carry out a plan's page-cache and disk tiers for streamed blocks (offload/tier_filler.py).

Checked when the plan is made (a PolicyError before anything loads) and again at placement."""

from __future__ import annotations

from .plan import Plan


def unsupported_tiers(plan: Plan, *, live: bool, ranks: bool) -> str | None:
    """Why the plan's page-cache/disk blocks cannot be carried out by this load (None: they can).

    Two experts move blocks between device and host from pinned masters; an AllGather rank reads its shard
    into its own arena. Neither reads blocks from their files yet. A live re-plan reads a block whose master is
    in a file tier from its files when it makes it resident (offload/streamer.py)."""
    if plan.tiers.all_pinned or not any(t != "pinned" for t in plan.tiers.blocks):
        return None
    if ranks:
        return "blocks read from the page cache or disk are not streamed across several GPUs yet: use one GPU"
    if plan.experts:
        return "two experts keep pinned masters of their blocks: the page-cache and disk tiers do not apply yet"
    return None
