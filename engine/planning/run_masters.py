"""`run`'s live load keeps no host master of what lives on the device: a resident block's or encoder's/VAE's master
is its file (the page-cache tier), not pinned memory.

`run --vram-budget` loads with live re-plan masters so that an out-of-memory step-down can move resident blocks
(engine/running/oom_guard.py). Pinned, those masters made the run hold the whole checkpoint (33.9 GB pinned for a
34 GB Flux-size model on a 12 GB card, 6.1 GB of them copies of what the device holds). Here each resident DiT block
is read once from its files straight to the device (offload/tier_filler.py, through a buffer of one block's size),
and a step-down that streams it reads it from there at each forward; a resident encoder/VAE is a file-tier stager
held on the device (offload/file_stager.py): a step-down that stages it reads it from its files at each stage.
What the host then pins is what the plan names: the streamed blocks and the staged masters
(`Forecast.pinned_host_bytes`), and the host forecast follows the tiers.

The console keeps its pinned masters (a live re-plan moves them at memory speed); two experts keep theirs (their
switch reads their resident blocks: engine/planning/ram_plan.py plans them under `--ram-budget`). Torch-free.
"""

from __future__ import annotations

from dataclasses import replace

from ...offload.tiers import HostTiers, Tier
from .host_forecast import built_from_files
from .plan import Plan


def masters_in_files(plan: Plan) -> Plan:
    """`plan` with every resident block's and resident encoder's/VAE's master in the page-cache tier (module
    docstring); a tier the plan set already (a `--ram-budget`'s) is kept."""
    if plan.policy.mode != "dlo" or plan.experts:
        return plan
    blocks: list[Tier] = [plan.tiers.block(i) if b.streamed else "page_cache" for i, b in enumerate(plan.blocks)]
    components = dict(plan.tiers.components)
    for c in plan.components:
        if (c.residency == "resident" and c.info.role in ("encoder", "vae") and c.info.has_weights
                and c.info.name not in components and built_from_files(c.info)):
            components[c.info.name] = "page_cache"
    kept = tuple(blocks) if any(t != "pinned" for t in blocks) else ()
    return replace(plan, tiers=HostTiers(kept, tuple(components.items())))
