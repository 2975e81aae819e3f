"""Carry out a new plan on a loaded model: only what changes moves, from the pinned masters.

DiT blocks: `LayerwiseStreamer.replan` (newly resident blocks copied to the device, newly streamed
ones freed, the ring rebuilt for the new placement and depth). Encoders/VAEs: their stagers are held
on the device (resident) or released to staging. VAE tiling/slicing and feed-forward chunking are
switched on the modules; streaming the text encoders layer by layer is a new load (refused here).
Nothing is read from disk, except the blocks whose masters a `--ram-budget` left in their files (the page
cache or disk tier): a block made resident is read from there, and the summary says how many and how much.
"""

from __future__ import annotations

import time

import torch

from ...offload.errors import PolicyError
from ...offload.layer_stage import LayerStage
from ...offload.units import format_bytes, format_seconds
from ..events import Replanned
from ..planning.lean import LABELS
from ..planning.plan import Plan
from .placement import Placement


def _describe(old: Plan, new: Plan) -> str:
    parts = []
    a, b = old.residency, new.residency
    if a != b:
        parts.append(f"DiT {a.num_resident}→{b.num_resident} resident ({b.placement}), ring {a.slots}→{b.slots}"
                     + (f", kept upcast {a.num_upcast}→{b.num_upcast}" if a.upcast != b.upcast else ""))
    before = {c.info.name: c.residency for c in old.components}
    for c in new.components:
        if before.get(c.info.name) != c.residency and c.info.role in ("encoder", "vae"):
            parts.append(f"{c.info.name} {before.get(c.info.name)}→{c.residency}")
    for name, label in LABELS.items():
        if old.policy.lean_on(name) != new.policy.lean_on(name):
            parts.append(f"{label} {'on' if new.policy.lean_on(name) else 'off'}")
    return "; ".join(parts) or "nothing changed"


def file_read_forecast(old: Plan, new: Plan, device: torch.device) -> float | None:
    """Seconds the re-plan from `old` to `new` should spend reading blocks from their files: each newly resident
    block whose master is in the page cache or on disk, at that tier's cached rate (an unmeasured one at its
    default: engine/planning/tier_cost.py); None when none is read."""
    from ..planning.request_profile import device_name
    from ..planning.tier_cost import known_rates
    from ..planning.tier_rates import measured_rates, tier_rates

    newly = [i for i, (was, now) in enumerate(zip(old.residency.resident, new.residency.resident, strict=True))
             if now and not was and new.tiers.block(i) != "pinned"]
    if not newly:
        return None
    cached = measured_rates(new.model.path, device_name(device), probe=False)
    rates = known_rates(tier_rates(cached, None)[0])
    return sum(new.blocks[i].nbytes / (rates.rate(new.tiers.block(i)) or 1.0) for i in newly)


def apply_replan(placement: Placement, old: Plan, new: Plan, device: torch.device) -> Replanned:
    """Move what differs between `old` and `new` (both plans of the loaded model); returns the event."""
    if old.policy.lean_on("stream_encoders") != new.policy.lean_on("stream_encoders"):
        raise PolicyError("streaming the text encoders layer by layer (or not) is a new load: unload (u), load (l)")
    for c in new.components:
        if isinstance(placement.stagers.get(c.info.name), LayerStage) and c.residency == "resident":
            raise PolicyError(f"{c.info.name} streams layer by layer: keeping it resident is a new load: unload (u), "
                              "load (l)")
    expected = file_read_forecast(old, new, device)
    start = time.perf_counter()
    if placement.relean is not None:
        placement.relean(new)  # VAE tiling/slicing, feed-forward chunking: flags on the modules
    copied = freed = ring = 0
    from_files = ""
    streamer = placement.streamer
    if streamer is not None and (streamer.residency != new.residency or old.experts != new.experts):
        stats = streamer.replan(new.residency, active=new.active_blocks)
        copied, freed, ring = stats.copied_bytes, stats.freed_bytes, stats.ring_bytes
        if stats.file_blocks:  # masters the --ram-budget left in the page cache or on disk
            forecast = f", forecast ~{format_seconds(expected)}" if expected is not None else ""
            from_files = (f" · {stats.file_blocks} blocks ({format_bytes(stats.file_bytes)}) read from the page cache "
                          f"or disk{forecast}")
    if placement.experts is not None:
        placement.experts.set_experts(new.experts)  # between requests the first expert runs
    for c in new.components:
        stager = placement.stagers.get(c.info.name)
        if stager is None:
            continue
        resident = c.residency == "resident"
        if resident != stager.held:
            copied += stager.hold(resident)
            freed += 0 if resident else stager.staged_bytes
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    summary = _describe(old, new)
    return Replanned(summary=f"re-plan: {summary} · copied {format_bytes(copied)}, freed {format_bytes(freed)} "
                             f"in {format_seconds(seconds)}{from_files}",
                     copied_bytes=copied, freed_bytes=freed, ring_bytes=ring, seconds=seconds)
