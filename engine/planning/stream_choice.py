"""Choose how the DiT streams under a device budget: which blocks stay resident, where, and k.

Pure arithmetic over a measured (or estimated) profile, shared by the auto-planner and the
benchmarks: every candidate (placement x resident count x ring depth) is replayed with the
streamer's copy schedule (`step_forecast.replay_forward`) and its denoise-phase peak is counted:

    fixed device bytes (DiT non-block weights, resident components)
  + resident block bytes + k x largest streamed block + DiT activations at the requested size.

The fastest candidate whose peak fits wins; among equally fast ones (within 0.5 % of the fastest),
the smaller peak. `stream_search` finds it without replaying every candidate.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...offload.residency import PLACEMENTS, BlockResidency
from ...offload.units import align_up
from .step_forecast import ForwardTime, replay_forward

if TYPE_CHECKING:  # numpy costs `plan` a third of a second; only a search needs it
    from .stream_search import StreamTable

RING_DEPTHS = (2, 3, 4, 6, 8, 12, 16, 24, 32)
TIE = 0.005  # candidates within 0.5 % of the fastest count as equally fast


@dataclass(frozen=True, slots=True)
class DitProfile:
    """What the choice needs to know about one DiT at one request size (execution order)."""

    block_bytes: tuple[int, ...]
    compute_s: tuple[float, ...]  # per block, one forward
    other_s: float  # per forward, outside the blocks (embeddings, norms, the scheduler step)
    forwards_per_step: int  # 2 with classifier-free guidance run as two forwards
    activation_bytes: int  # denoise-phase device bytes above the weights (latents, activations)


def profile_from_timings(block_bytes: Sequence[int], compute_s: Sequence[float], forward_s: float,
                         forwards_per_step: int, activation_bytes: int) -> DitProfile:
    """A profile from per-block timings and the whole forward's time without timing hooks.

    The hooks' own launch overhead can make the blocks add up to more than the plain forward; then
    the blocks are scaled down to it (and nothing is left outside them), else the rest is `other_s`."""
    total = sum(compute_s)
    scale = forward_s / total if total > forward_s > 0 else 1.0
    compute = tuple(c * scale for c in compute_s)
    return DitProfile(tuple(block_bytes), compute, max(forward_s - sum(compute), 0.0), forwards_per_step,
                      activation_bytes)


@dataclass(frozen=True, slots=True)
class StreamChoice:
    residency: BlockResidency
    forward: ForwardTime
    step_s: float
    peak_bytes: int  # denoise phase
    resident_bytes: int  # resident blocks
    slot_bytes: int


def largest_streamed(block_bytes: Sequence[int], residency: BlockResidency) -> int:
    return max((align_up(b) for b, r in zip(block_bytes, residency.resident, strict=True) if not r), default=0)


def evaluate(profile: DitProfile, residency: BlockResidency, bandwidth: float, fixed_bytes: int,
             phase_extra: int = 0) -> StreamChoice:
    """Predicted step time and peak of one residency: the denoise phase, or another phase (text
    encoding, VAE decode) when its bytes above the weights (`phase_extra`) are larger."""
    forward = replay_forward(profile.compute_s, profile.block_bytes, residency, bandwidth, profile.other_s)
    resident = sum(b for b, r in zip(profile.block_bytes, residency.resident, strict=True) if r)
    slots = residency.slots * largest_streamed(profile.block_bytes, residency)
    peak = fixed_bytes + resident + slots + max(profile.activation_bytes, phase_extra)
    return StreamChoice(residency, forward, forward.seconds * profile.forwards_per_step, peak, resident, slots)


def candidates(num_blocks: int, depths: Sequence[int] = RING_DEPTHS) -> Iterator[BlockResidency]:
    """Every placement x resident count x ring depth (depths past the streamed count collapse)."""
    seen: set[tuple[str, tuple[bool, ...], int]] = set()
    for placement in PLACEMENTS:
        for resident in range(num_blocks + 1):
            for k in depths:
                r = BlockResidency.placed(placement, num_blocks, resident, k)
                if (r.placement, r.resident, r.slots) not in seen:
                    seen.add((r.placement, r.resident, r.slots))
                    yield r


def choose_streaming(profile: DitProfile, bandwidth: float, fixed_bytes: int, budget: int | None,
                     placements: Sequence[str] = PLACEMENTS, phase_extra: int = 0,
                     table: StreamTable | None = None) -> tuple[StreamChoice | None, StreamChoice]:
    """(the fastest choice within `budget` or None, the choice with the smallest peak).

    Among the candidates that fit, the fastest step wins; among those within `TIE` of it, the smallest
    peak, then the first in `candidates` order. Searched in polynomial time (`stream_search`); pass
    the `table` of an earlier call with the same profile, bandwidth and placements to reuse it."""
    if table is None:
        from .stream_search import StreamTable

        table = StreamTable(profile, bandwidth, placements)
    above = fixed_bytes + max(profile.activation_bytes, phase_extra)  # peak = above + the candidate's room
    smallest = evaluate(profile, table.residency(table.least_room()), bandwidth, fixed_bytes, phase_extra)
    if budget is None:
        index = table.choose(2**62, TIE)
    else:
        index = table.choose(budget - above, TIE) if budget >= above else None
    if index is None:
        return None, smallest
    return evaluate(profile, table.residency(index), bandwidth, fixed_bytes, phase_extra), smallest
