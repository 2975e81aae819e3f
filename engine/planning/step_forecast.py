"""Step time of a streamed DiT, predicted by replaying the streamer's copy schedule.

The model is the streamer's own protocol (offload/streamer.py): one compute stream, one copy
stream that runs copies in issue order, a ring of k slots. A streamed block's copy is issued when
the block k streamed blocks before it (cyclically, across forwards) finishes computing, starts when
the link is free, and takes bytes / bandwidth; a streamed block starts computing when both the
previous block and its copy are done. Resident blocks only compute. Work outside the blocks
(embeddings, the scheduler step) runs first in each forward, so copies issued at the end of one
forward overlap it — as on the device.

The replay runs a few forwards from a cold ring and reports the last one (the steady state).

A byte ring (`residency.byte_ring`, offload/byte_ring.py: a UNet's units) is replayed with the same
bookkeeping the streamer uses (`RingLayout`): when a unit finishes computing it is freed, and every
following unit whose fixed bytes are now free is issued at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...offload.residency import BlockResidency
from ...offload.ring_layout import RingLayout
from ...offload.units import ALIGNMENT, align_up

FORWARDS = 4  # replayed forwards; the ring reaches its steady state within two


@dataclass(frozen=True, slots=True)
class ForwardTime:
    """One steady-state DiT forward: wall seconds, of which compute and exposed copy wait (stall)."""

    seconds: float
    compute_s: float
    stall_s: float
    transfer_s: float  # the link busy time: streamed bytes / bandwidth

    @property
    def floor_s(self) -> float:
        """max(compute, transfer): what no schedule can beat."""
        return max(self.compute_s, self.transfer_s)


def replay_forward(compute_s: Sequence[float], block_bytes: Sequence[int], residency: BlockResidency,
                   bandwidth: float, other_s: float = 0.0) -> ForwardTime:
    """Predicted steady-state forward time for per-block compute seconds and bytes (execution order)."""
    if len(compute_s) != residency.num_blocks or len(block_bytes) != residency.num_blocks:
        raise ValueError("one compute time and one size per block are needed")
    if bandwidth <= 0:
        raise ValueError("bandwidth must be positive")
    streamed = [i for i, r in enumerate(residency.resident) if not r]
    copy_s = [block_bytes[i] / bandwidth for i in streamed]
    n, k = len(streamed), residency.slots
    compute = other_s + sum(compute_s)
    if n == 0:
        return ForwardTime(compute, compute, 0.0, 0.0)
    if residency.byte_ring:
        return _replay_byte_ring(compute_s, [block_bytes[i] for i in streamed], copy_s, residency, other_s)
    if n <= k:  # the ring holds every streamed block: copied once, never again
        return ForwardTime(compute, compute, 0.0, 0.0)
    ready: dict[int, float] = {}  # global streamed index (forward * n + position) -> copy end
    link_free = 0.0
    for g in range(k):  # attach fills the ring
        link_free += copy_s[g % n]
        ready[g] = link_free
    t, start_last, stall = 0.0, 0.0, 0.0
    for f in range(FORWARDS):
        start_last, stall = t, 0.0
        t += other_s
        pos = 0
        for i, c in enumerate(compute_s):
            if residency.resident[i]:
                t += c
                continue
            g = f * n + pos
            begin = max(t, ready.pop(g))
            stall += begin - t
            t = begin + c
            link_free = max(t, link_free) + copy_s[(g + k) % n]  # issued when this block's slot frees
            ready[g + k] = link_free
            pos += 1
    return ForwardTime(t - start_last, compute, stall, sum(copy_s))


def _replay_byte_ring(compute_s: Sequence[float], sizes: Sequence[int], copy_s: Sequence[float],
                      residency: BlockResidency, other_s: float) -> ForwardTime:
    """`replay_forward` for a byte ring: k largest units' bytes, each unit at its fixed offset."""
    aligned = [align_up(s, ALIGNMENT) for s in sizes]
    compute = other_s + sum(compute_s)
    if not any(aligned):
        return ForwardTime(compute, compute, 0.0, 0.0)
    ring = RingLayout(aligned, residency.slots * max(aligned), ALIGNMENT)
    if ring.disjoint:  # every streamed unit fits at once: copied at attach, never again
        return ForwardTime(compute, compute, 0.0, 0.0)
    n = len(sizes)
    ready: dict[int, float] = {}
    link_free, upcoming = 0.0, 0

    def admit(now: float) -> None:
        nonlocal link_free, upcoming
        while ring.place(upcoming):
            link_free = max(now, link_free) + copy_s[upcoming]
            ready[upcoming] = link_free
            upcoming = (upcoming + 1) % n

    admit(0.0)  # attach fills the ring
    t, start_last, stall = 0.0, 0.0, 0.0
    for _ in range(FORWARDS):
        start_last, stall = t, 0.0
        t += other_s
        pos = 0
        for i, c in enumerate(compute_s):
            if residency.resident[i]:
                t += c
                continue
            begin = max(t, ready[pos])
            stall += begin - t
            t = begin + c
            while ring.pop() != pos:  # freed when it has computed
                pass
            admit(t)
            pos += 1
    return ForwardTime(t - start_last, compute, stall, sum(copy_s))
