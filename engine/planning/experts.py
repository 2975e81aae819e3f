"""Two DiT experts of which one runs per forward (Wan 2.2 A14B): which they are, and how they share a budget.

diffusers' Wan 2.2 pipelines (`WanPipeline`, `WanImageToVideoPipeline`, `WanVACEPipeline`) hold a
high-noise expert `transformer` and a low-noise expert `transformer_2`; a step calls `transformer` while
its timestep is at or above `boundary_ratio * num_train_timesteps` and `transformer_2` after that (only
`transformer` when `boundary_ratio` is None). diffusers names no other pipeline's DiTs that way, so the
two names are the rule.

Budget: the policy's residency (resident blocks, placement, ring depth) applies to each expert's own
blocks, and only the running expert has resident blocks and a ring on the device; the other's blocks
are *parked* (only their pinned masters). So the device holds one expert's share (the larger of the
two) and the host holds both whole. The switch itself is `engine.loading.expert_switch`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...offload.policy import OffloadPolicy
from ...offload.residency import BlockResidency
from ..model_dir.discovery import ModelInfo

EXPERT_NAMES = ("transformer", "transformer_2")  # diffusers' high-noise, low-noise experts


@dataclass(frozen=True, slots=True)
class Expert:
    """One expert: its DiT component, its blocks' span in the execution order, its own residency."""

    name: str
    start: int
    count: int
    residency: BlockResidency  # over its own `count` blocks

    @property
    def stop(self) -> int:
        return self.start + self.count


def expert_spans(model: ModelInfo) -> list[tuple[str, int, int]]:
    """(name, first block, block count) of each expert, in execution order; [] when the model has none."""
    spans: list[tuple[str, int, int]] = []
    start = 0
    for dit in model.dits:
        if dit.name in EXPERT_NAMES and dit.num_blocks:
            spans.append((dit.name, start, dit.num_blocks))
        start += dit.num_blocks
    names = {s[0] for s in spans}
    return spans if names == set(EXPERT_NAMES) and len(model.dits) == len(EXPERT_NAMES) else []


def blocks_per_forward(model: ModelInfo) -> int:
    """The blocks one DiT forward runs: one expert's (the smaller, so a count fits both), else all."""
    spans = expert_spans(model)
    return min(c for _, _, c in spans) if spans else model.num_dit_blocks


def plan_experts(model: ModelInfo, policy: OffloadPolicy) -> tuple[Expert, ...]:
    """Each expert with the policy's residency over its own blocks; () without experts or in resident mode
    (everything resident: nothing to hand over)."""
    if policy.mode == "resident":
        return ()
    return tuple(Expert(name, start, count, policy.block_residency(count))
                 for name, start, count in expert_spans(model))


def streamer_residency(experts: tuple[Expert, ...], active: int,
                       num_blocks: int) -> tuple[BlockResidency, tuple[bool, ...]]:
    """The streamer's residency over all `num_blocks` blocks while expert `active` runs, and its active mask:
    the running expert's blocks as its residency says, the other's parked (not resident, not in the ring)."""
    resident = [False] * num_blocks
    ring = [False] * num_blocks
    for i, e in enumerate(experts):
        if i == active:
            resident[e.start:e.stop] = e.residency.resident
            ring[e.start:e.stop] = [True] * e.count
    run = experts[active].residency
    slots = run.slots or (1 if not all(resident) else 0)  # the validation's minimum; no ring is built then
    return BlockResidency(tuple(resident), slots, run.placement), tuple(ring)
