"""fp8 storage under `--vram-budget`: which resident blocks to keep upcast, weighed with the streaming choice.

A resident fp8 block is upcast before every forward (offload/upcast.py); kept upcast it is converted
once at load instead, for one more device byte per fp8 element (bf16/fp16 compute: twice its fp8
bytes) and no upcast time per forward (H200, Flux-size: ~0.6 ms a block, 0.207 s resident fp8 against
0.173 s bf16 a forward). The same bytes could instead keep more blocks resident in fp8 (fewer bytes
on the link). So the search is over pairs (streaming candidate of `stream_search.StreamTable`,
upcast count u): the candidate's room plus the first u resident blocks' extra bytes must fit, and
the step is the streamer's copy schedule replayed with those blocks' upcast taken off their compute
(taking compute off a block never makes the replay slower, so for each candidate the most that fits
is the fastest; u is then cut to the fewest that give that same step, and is 0 unless it lowers it).

Among pairs within `TIE` of the fastest: for the encoder/VAE decisions the smallest room (as the
table's own `choose`), for the final choice the fewest bytes streamed per step (then the smallest
room): at an equal predicted step, bytes kept off the link were measured faster (budget sweep,
2026-12-02: 20 resident k=2 0.1974 s against the planner's 9 resident k=6 0.201 s at 12 GB).

`Chooser` is what the auto-planner asks; `PlainChooser` (no fp8, upcast "off", or nothing measured)
is the table's own choice, unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np

from ...offload.residency import BlockResidency
from .stream_choice import DitProfile, StreamChoice, evaluate
from .stream_search import SAFETY, StreamTable

Prefer = Literal["room", "streamed"]


@dataclass(frozen=True, slots=True)
class Pick:
    """A streaming candidate of the table (`index`) and how many of its resident blocks stay upcast."""

    index: int
    upcast: int = 0


class Chooser(Protocol):
    def choose(self, room: int, tie: float, prefer: Prefer = "room") -> Pick | None: ...
    def step(self, pick: Pick) -> float: ...
    def room_of(self, pick: Pick) -> int: ...
    def residency(self, pick: Pick) -> BlockResidency: ...
    def evaluate(self, pick: Pick, fixed_bytes: int, phase_extra: int = 0) -> StreamChoice: ...


class PlainChooser:
    """The table's choice as it always was: no block kept upcast."""

    def __init__(self, table: StreamTable) -> None:
        self.table = table

    def choose(self, room: int, tie: float, prefer: Prefer = "room") -> Pick | None:
        index = self.table.choose(room, tie)
        return None if index is None else Pick(index)

    def step(self, pick: Pick) -> float:
        return self.table.step(pick.index)

    def room_of(self, pick: Pick) -> int:
        return int(self.table.room[pick.index])

    def residency(self, pick: Pick) -> BlockResidency:
        return self.table.residency(pick.index)

    def evaluate(self, pick: Pick, fixed_bytes: int, phase_extra: int = 0) -> StreamChoice:
        t = self.table
        return evaluate(t.profile, t.residency(pick.index), t.bandwidth, fixed_bytes, phase_extra)


class UpcastChooser(PlainChooser):
    """Pairs (candidate, upcast count); `upcast_s` / `extra_bytes`: each block's upcast seconds per forward
    (inside the profile's compute) and the device bytes keeping it upcast adds."""

    def __init__(self, table: StreamTable, upcast_s: Sequence[float], extra_bytes: Sequence[int]) -> None:
        super().__init__(table)
        self.upcast_s, self.extra = tuple(upcast_s), tuple(extra_bytes)
        # the most a pair can save a step: every block's upcast, and no more than its spare room's worth at the
        # best seconds-per-byte of any block (the slack below each candidate's bound)
        fps = table.profile.forwards_per_step
        self._saving = sum(upcast_s) * fps
        self._per_byte = max((u / e for u, e in zip(upcast_s, extra_bytes, strict=True) if e), default=0.0) * fps
        self._steps: dict[Pick, float] = {}
        self._resident: dict[int, BlockResidency] = {}

    def _base(self, index: int) -> BlockResidency:
        if index not in self._resident:
            self._resident[index] = self.table.residency(index)
        return self._resident[index]

    def residency(self, pick: Pick) -> BlockResidency:
        base = self._base(pick.index)
        return base.with_upcast(pick.upcast) if pick.upcast else base

    def _extra(self, index: int, count: int) -> int:
        """Device bytes the first `count` resident blocks of candidate `index` add kept upcast."""
        kept = self._base(index).with_upcast(count).upcast_flags
        return sum(e for e, k in zip(self.extra, kept, strict=True) if k)

    def room_of(self, pick: Pick) -> int:
        return int(self.table.room[pick.index]) + (self._extra(pick.index, pick.upcast) if pick.upcast else 0)

    def _profile(self, pick: Pick) -> DitProfile:
        p = self.table.profile
        kept = self.residency(pick).upcast_flags
        compute = tuple(max(c - u, 0.0) if k else c for c, u, k in zip(p.compute_s, self.upcast_s, kept, strict=True))
        return replace(p, compute_s=compute)

    def step(self, pick: Pick) -> float:
        if not pick.upcast:
            return self.table.step(pick.index)
        if pick not in self._steps:
            t = self.table
            self._steps[pick] = evaluate(self._profile(pick), self.residency(pick), t.bandwidth, 0).step_s
        return self._steps[pick]

    def evaluate(self, pick: Pick, fixed_bytes: int, phase_extra: int = 0) -> StreamChoice:
        t = self.table
        choice = evaluate(self._profile(pick), self.residency(pick), t.bandwidth, fixed_bytes, phase_extra)
        extra = self._extra(pick.index, pick.upcast) if pick.upcast else 0
        return replace(choice, peak_bytes=choice.peak_bytes + extra, resident_bytes=choice.resident_bytes + extra)

    def best_upcast(self, index: int, room: int, fewest: bool = True) -> Pick:
        """Candidate `index` with the upcast blocks that give the fastest step fitting `room` (0: none lowers
        it); `fewest`: the fewest that give it, else the most that fit."""
        base = self._base(index)
        left = room - int(self.table.room[index])
        most, used = 0, 0
        for e, r in zip(self.extra, base.resident, strict=True):
            if r:
                if used + e > left:
                    break
                used, most = used + e, most + 1
        if most == 0:
            return Pick(index)
        plain, best = self.step(Pick(index)), self.step(Pick(index, most))
        if not best < plain * (1 - SAFETY):
            return Pick(index)
        if not fewest:
            return Pick(index, most)
        lo, hi = 1, most  # the step never rises with u: the fewest giving `best`
        while lo < hi:
            mid = (lo + hi) // 2
            if self.step(Pick(index, mid)) <= best * (1 + SAFETY):
                hi = mid
            else:
                lo = mid + 1
        return Pick(index, lo)

    def choose(self, room: int, tie: float, prefer: Prefer = "room") -> Pick | None:
        t = self.table
        fits = np.flatnonzero(t.room <= room)
        lower = t.bound[fits] - np.minimum(self._saving, (room - t.room[fits]) * self._per_byte)
        order = np.argsort(lower, kind="stable")
        best, seen = math.inf, []
        for index, bound in zip(fits[order].tolist(), lower[order].tolist(), strict=True):
            if bound >= best * (1 + tie) * (1 + SAFETY):
                break  # nothing further can come within the tie, even with its spare room all upcast
            pick = self.best_upcast(index, room, fewest=False)
            step = self.step(pick)
            best = min(best, step)
            seen.append((step, pick))
        if not seen:
            return None
        within = [self.best_upcast(p.index, room) if p.upcast else p for s, p in seen if s <= best * (1 + tie)]
        if prefer == "streamed":
            return min(within, key=lambda p: (self._streamed_bytes(p.index), self.room_of(p), p.index))
        return min(within, key=lambda p: (self.room_of(p), p.index))

    def _streamed_bytes(self, index: int) -> int:
        resident = self._base(index).resident
        return sum(b for b, r in zip(self.table.profile.block_bytes, resident, strict=True) if not r)
