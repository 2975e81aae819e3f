"""The DiT streaming search in polynomial time: every candidate's room computed at once, few replayed.

`stream_choice.choose_streaming` picks, among every placement x resident count x ring depth whose
device bytes fit, the fastest (by the streamer's replayed copy schedule) and, among those within
`TIE` of it, the one with the smallest peak (then the first in enumeration order). Replaying every
candidate costs O(blocks) each and there are about 18 x (blocks + 1) of them: 34 s for 300 blocks,
minutes for 2000. Here each candidate's device bytes ("room": resident blocks + k slots) and a
lower bound of its step time are computed for all candidates at once (numpy, no replay), once per
profile; a query then replays only the candidates whose bound could still win, in order of that
bound, and answers any number of budgets from the same table (the auto-planner asks once per
encoder/VAE decision).

The lower bound, for a candidate with n streamed blocks through k < n slots: a forward cannot be
shorter than its compute, nor than the copies of its streamed positions k..n-1 (they are issued
only once the forward has begun and run one after another on the link). Without compute (no
profile yet) the link never idles and the bound is the whole transfer, which is then the replay's
answer too (computed as the replay's own running sum). A byte ring (a UNet's) may hold more than k
units when a forward begins, but never more than its k x largest bytes: their copies are what its
bound leaves out; with k >= n it holds every unit (their aligned bytes are at most n x largest).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...offload.residency import PLACEMENTS, BlockResidency
from ...offload.units import ALIGNMENT
from .step_forecast import FORWARDS

if TYPE_CHECKING:
    from .stream_choice import DitProfile

SAFETY = 1e-9  # relative: bounds are summed in another order than the replay; never prune a true winner


class StreamTable:
    """Every streaming candidate of one DiT profile, with its room and a lower bound of its step."""

    def __init__(self, profile: DitProfile, bandwidth: float, placements: Sequence[str] = PLACEMENTS,
                 depths: Sequence[int] | None = None, byte_ring: bool = False) -> None:
        from .stream_choice import RING_DEPTHS

        self.byte_ring = byte_ring  # a UNet's ring: the k slots' bytes as one buffer (offload/byte_ring.py)

        if not bandwidth > 0 or not math.isfinite(bandwidth):
            raise ValueError("bandwidth must be positive")
        self.profile, self.bandwidth = profile, bandwidth
        ks = np.asarray(RING_DEPTHS if depths is None else depths, dtype=np.int64)
        n_blocks = self._n = len(profile.block_bytes)
        sizes = np.asarray(profile.block_bytes, dtype=np.int64).reshape(-1)
        self._copy = copy = sizes / bandwidth
        self._compute = profile.other_s + sum(profile.compute_s)  # the replay's own sum, in its order
        self._no_compute = profile.other_s == 0 and not any(profile.compute_s)
        fps = profile.forwards_per_step
        placement, resident, slots, room, bound = [], [], [], [], []
        for p, name in enumerate(PLACEMENTS):
            kept, largest, transfer, first = self._per_count(name, sizes, copy, ks)
            n = n_blocks - np.arange(n_blocks + 1)  # streamed blocks per resident count r = 0..N
            slot = np.minimum(n[:, None], ks[None, :])  # (N+1, depths)
            keep = np.ones_like(slot, dtype=bool)
            keep[:, 1:] = slot[:, 1:] != slot[:, :-1]  # depths past the streamed count collapse
            if name not in placements:
                keep &= (n == 0)[:, None]  # all resident is the same under any placement
            if byte_ring:  # the ring holds at most its bytes when a forward begins
                first = np.minimum(transfer[:, None], slot * largest[:, None] / bandwidth)
            hidden = np.where(self._no_compute, 0.0, first)  # copies that may run before the forward
            lower = np.maximum(self._compute, transfer[:, None] - hidden) * fps * (1 - SAFETY)
            exact = (n[:, None] == 0) | (n[:, None] <= slot)  # the ring holds every streamed block
            lower = np.where(exact, self._compute * fps, lower)
            r_index = np.broadcast_to(np.arange(n_blocks + 1)[:, None], slot.shape)
            placement.append(np.full(int(keep.sum()), p))
            resident.append(r_index[keep])
            slots.append(slot[keep])
            room.append((kept[:, None] + slot * largest[:, None])[keep])
            bound.append(lower[keep])
        self.placement = np.concatenate(placement)
        self.resident = np.concatenate(resident)
        self.slots = np.concatenate(slots)
        self.room = np.concatenate(room)
        self.bound = np.concatenate(bound)
        self.by_bound = np.argsort(self.bound, kind="stable")
        self.by_room = np.argsort(self.room, kind="stable")  # ties: the first enumerated
        self._room_by_room = self.room[self.by_room]
        self._room_by_bound = self.room[self.by_bound]
        self._bound_by_room = self.bound[self.by_room]
        self._steps: dict[int, float] = {}

    def _per_count(self, placement: str, sizes: np.ndarray, copy: np.ndarray, ks: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per resident count r = 0..N: resident bytes, the largest streamed block (aligned), the
        streamed copy seconds, and for each depth k the copy seconds of the first k streamed blocks."""
        n_blocks = self._n
        aligned = -(-sizes // ALIGNMENT) * ALIGNMENT
        counts = np.arange(n_blocks + 1)
        kept = np.zeros(n_blocks + 1, dtype=np.int64)
        largest = np.zeros(n_blocks + 1, dtype=np.int64)
        transfer = np.zeros(n_blocks + 1)
        first = np.zeros((n_blocks + 1, len(ks)))
        if n_blocks == 0:
            return kept, largest, transfer, first
        if placement == "leading":  # blocks r..N-1 stream
            kept[1:] = np.cumsum(sizes)
            largest[:-1] = np.maximum.accumulate(aligned[::-1])[::-1]
            cc = np.concatenate(([0.0], np.cumsum(copy)))
            transfer = cc[-1] - cc[counts]
            first = cc[np.minimum(counts[:, None] + ks[None, :], n_blocks)] - cc[counts][:, None]
            return kept, largest, transfer, first
        # spread: the j-th streamed block (0-based) of s is at ceil((j+1)N/s) - 1 (offload.residency's
        # spread_streamed); every count's positions at once, about N x N / 2 of them, in bounded chunks
        streamed_counts = n_blocks - counts
        js = np.arange(int(ks.max()))[None, :]
        s_col = np.maximum(streamed_counts, 1)[:, None]
        pos = np.clip(((js + 1) * n_blocks + s_col - 1) // s_col - 1, 0, n_blocks - 1)
        first = np.where(js < streamed_counts[:, None], copy[pos], 0.0).cumsum(axis=1)[:, ks - 1]
        kept[:] = int(sizes.sum())
        rows = np.flatnonzero(streamed_counts)
        for chunk in np.array_split(rows, max(1, int(streamed_counts.sum()) // 2_000_000 + 1)):
            seg = streamed_counts[chunk].astype(np.int32)  # (j+1) x N stays below 2**31 for N <= 4096 blocks
            starts = np.cumsum(seg) - seg
            ss = np.repeat(seg, seg)
            j = np.arange(len(ss), dtype=np.int32) - np.repeat(starts, seg)
            at = ((j + 1) * np.int32(n_blocks) + ss - 1) // ss - 1
            kept[chunk] -= np.add.reduceat(sizes[at], starts)
            largest[chunk] = np.maximum.reduceat(aligned[at], starts)
            transfer[chunk] = np.add.reduceat(copy[at], starts)
        return kept, largest, transfer, first

    def residency(self, index: int) -> BlockResidency:
        name = PLACEMENTS[int(self.placement[index])]
        r = BlockResidency.placed(name, self._n, int(self.resident[index]), int(self.slots[index]))
        if self.byte_ring and r.num_streamed:
            return BlockResidency(r.resident, r.slots, r.placement, byte_ring=True)
        return r

    def step(self, index: int) -> float:
        """The candidate's step seconds, as `stream_choice.evaluate` replays it (cached)."""
        if index in self._steps:
            return self._steps[index]
        fps = self.profile.forwards_per_step
        n, slots = self._n - int(self.resident[index]), int(self.slots[index])
        if n == 0 or n <= slots:
            value = self._compute * fps
        elif self._no_compute:  # the link never idles: the replay's running sum of copies, forward 4 less 3
            streamed = self._copy[~np.asarray(self.residency(index).resident, dtype=bool)]
            total = np.cumsum(np.tile(streamed, FORWARDS))
            value = float(total[-1] - total[(FORWARDS - 1) * n - 1]) * fps
        else:
            from .step_forecast import replay_forward

            p = self.profile
            value = replay_forward(p.compute_s, p.block_bytes, self.residency(index), self.bandwidth,
                                   p.other_s).seconds * fps
        self._steps[index] = value
        return value

    def fastest(self, room: int) -> float | None:
        """The least step time of a candidate within `room` bytes (None: none fits)."""
        best = math.inf
        for index in _lazy(self.by_bound[self._room_by_bound <= room]):
            if self.bound[index] >= best * (1 - SAFETY):
                break  # sorted by bound: nothing further can be faster
            best = min(best, self.step(index))
        return None if best == math.inf else best

    def choose(self, room: int, tie: float) -> int | None:
        """The candidate `choose_streaming` picks within `room`: the smallest room (then the first) among
        those within `tie` of the fastest."""
        fastest = self.fastest(room)
        if fastest is None:
            return None
        limit = fastest * (1 + tie)
        hopeful = (self._room_by_room <= room) & (self._bound_by_room <= limit)
        for index in _lazy(self.by_room[hopeful]):
            if self.step(index) <= limit:
                return index
        raise AssertionError("the fastest candidate is within its own tie")  # unreachable

    def least_room(self) -> int:
        """The index of the candidate with the smallest room (the smallest possible peak)."""
        return int(self.by_room[0])


def _lazy(indices: np.ndarray, chunk: int = 64):
    """The indices as Python ints, a chunk at a time (a search usually stops within the first few)."""
    for lo in range(0, len(indices), chunk):
        yield from indices[lo:lo + chunk].tolist()
