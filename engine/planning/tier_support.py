"""Which loads can carry out a plan's page-cache and disk tiers for streamed blocks (offload/tier_filler.py).

Checked when the plan is made (a PolicyError before anything loads) and again at placement."""

from __future__ import annotations

from .plan import Plan


def unsupported_tiers(plan: Plan, *, live: bool, ranks: bool) -> str | None:
    """Why the plan's page-cache/disk blocks cannot be carried out by this load (None: they can).

    A live re-plan moves blocks between device and host from pinned masters; an AllGather rank reads its
    shard into its own arena. Neither reads blocks from their files yet. Two experts do: a block of either in
    a file tier is read from its file when its expert runs (resident or streamed), none is pinned."""
    if plan.tiers.all_pinned or not any(t != "pinned" for t in plan.tiers.blocks):
        return None
    if ranks:
        return "blocks read from the page cache or disk are not streamed across several GPUs yet: use one GPU"
    if live:
        return "a live re-plan keeps pinned masters of every block: the page-cache and disk tiers do not apply"
    return None
