"""Which plan an allocator's cache was measured under, so a cached figure is used only for that plan.

The caching allocator's reserved-above-allocated at a request's peak (cache and fragmentation) follows
the order and sizes of the request's allocations, and those follow the plan: resident blocks, ring
slots, staged components, lean phases. Measured on one H200 under a 12 GB card, the same request size
left 0.51 GB reserved above allocated with 14 resident blocks and 0.06 GB with 15; with one plan run
twice (Wan-size, 8 GB) it was 0.71 and 0.84 GB. So the figure is kept with a key of its plan, and a plan
with another key is forecast with the margin instead.
"""

from __future__ import annotations

import hashlib
import json

from ...offload.policy import LEAN_FIELDS
from .plan import Plan
from .request_profile import RequestProfile


def plan_key(plan: Plan) -> str:
    """A short key of what shapes the allocations of a request under `plan` (block order aside)."""
    r = plan.residency
    doc = {"resident": r.num_resident, "slots": r.slots, "placement": r.placement, "byte_ring": r.byte_ring,
           "upcast": sum(r.upcast), "experts": len(plan.experts), "stream_dtype": plan.stream_dtype,
           "components": sorted((c.info.name, c.residency) for c in plan.components),
           "lean": {n: str(getattr(plan.policy, n)) for n in LEAN_FIELDS}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def slack_for(profile: RequestProfile | None, plan: Plan) -> int | None:
    """The profile's allocator slack if it was measured under this plan's key, else None (the margin)."""
    if profile is None or profile.allocator_slack_bytes is None or profile.allocator_slack_plan != plan_key(plan):
        return None
    return profile.allocator_slack_bytes
