"""Which loads can carry out a plan's page-cache and disk tiers: streamed blocks (offload/tier_filler.py) and
staged encoders/VAEs, whole or streamed layer by layer (offload/file_stager.py, offload/layer_stage.py).

Checked when the plan is made (a PolicyError before anything loads) and again at placement."""

from __future__ import annotations

from .plan import Plan


def unsupported_tiers(plan: Plan, *, live: bool, ranks: bool) -> str | None:
    """Why the plan's page-cache/disk items cannot be carried out by this load (None: they can).

    An AllGather rank reads its shard into its own arena, not from the files. Two experts read a block of either
    in a file tier from its file when its expert runs (resident or streamed); a live re-plan reads a block whose
    master is in a file tier from its files when it makes it resident (offload/streamer.py). A component
    is read from its files only where it is staged, on one GPU, without live re-plan masters, or where a live load
    keeps it resident with its files as its master (`run`: engine/planning/run_masters.py)."""
    files = [name for name, tier in plan.tiers.components if tier != "pinned"]
    if files:
        staged = {c.info.name for c in plan.components if c.residency == "staged"}
        # a live load's resident encoder/VAE whose master is its files: a file-tier stager held on the device
        held = {c.info.name for c in plan.components if live and c.residency == "resident"
                and c.info.role in ("encoder", "vae") and plan.policy.mode == "dlo"}
        if not set(files) <= staged | held:
            names = ", ".join(sorted(set(files) - staged - held))
            return f"{names}: only a staged component is read from the page cache or disk (this plan does not stage it)"
        if ranks:
            return "encoders/VAEs read from the page cache or disk are not staged across several GPUs yet: use one GPU"
        if live and set(files) & staged:
            return ("a live re-plan keeps a host master of every encoder/VAE: the page-cache and disk tiers of "
                    "staged components do not apply")
    if plan.tiers.all_pinned or not any(t != "pinned" for t in plan.tiers.blocks):
        return None
    if ranks:
        return "blocks read from the page cache or disk are not streamed across several GPUs yet: use one GPU"
    return None
