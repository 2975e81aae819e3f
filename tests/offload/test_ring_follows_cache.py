"""The ring follows a step cache's decision: over random hit patterns, placements and ring depths, no block is
ever computed on stale slot bytes (bit-identical to the resident model), no block is fetched synchronously, and
once a forward's decision is known no skipped block's copy is issued for it.

The model stands in for diffusers' First-Block Cache: the head block runs, the cache decides, and on a hit every
later block is called but returns its input without touching its weights (as diffusers' block hook does).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from offload_toy_models import ToyBlock, ToyModel

from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer

DIM = 16


class FollowBlock(ToyBlock):
    skipping = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.skipping else super().forward(x)


class CachedToy(ToyModel):
    """Head block, decision, then the rest (run or passed through), like FBC on a DiT."""

    def __init__(self, n: int) -> None:
        super().__init__(n, DIM)
        for b in self.all_blocks():
            b.__class__ = FollowBlock
        self.hits: list[bool] = []
        self.decided = lambda: None
        self.hit = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = self.all_blocks()
        h = blocks[0](self.embed(x))
        self.hit = self.hits.pop(0)
        self.decided()
        for b in blocks[1:]:
            b.skipping = self.hit
            h = b(h)
            b.skipping = False
        return self.out(h)


@pytest.mark.slow  # 40 examples of up to 8 forwards
@settings(max_examples=40, deadline=None)
@given(n=st.integers(3, 7), slots=st.integers(2, 4), resident=st.integers(0, 2),
       placement=st.sampled_from(["leading", "spread"]), pattern=st.lists(st.booleans(), min_size=1, max_size=8),
       predict=st.booleans())
def test_random_hit_patterns_stay_exact_without_sync_fetches_or_skipped_copies(n, slots, resident, placement,
                                                                                pattern, predict):
    """`predict`: before a forward's decision the ring assumes the previous forward's (as `SkipFollower` does);
    else it assumes every block runs."""
    reference, model = CachedToy(n), CachedToy(n)
    residency = BlockResidency.placed(placement, n, resident, slots)
    streamer = LayerwiseStreamer(model.block_lists(), "cpu", residency=residency)
    blocks = model.all_blocks()
    streamed = [b for b, r in zip(blocks, residency.resident, strict=True) if not r]
    log: list[tuple[int, bool, torch.nn.Module]] = []  # (forward, decided yet, block) per copy issued
    state = {"forward": -1, "decided": False}
    fill = streamer.filler.fill

    def recording_fill(b, slot, **kw):
        log.append((state["forward"], state["decided"], b.module))
        return fill(b, slot, **kw)

    streamer.filler.fill = recording_fill
    head = blocks[0]
    retarget = streamer.follow_skips(lambda m: model.hit and m is not head and (predict or state["decided"]))
    streamer.attach()

    def decided() -> None:
        state["decided"] = True
        retarget()

    model.decided = decided
    streamer.take_step_stats()
    x = torch.randn(2, DIM, generator=torch.Generator().manual_seed(1))
    skipped = 0
    with torch.no_grad():
        for f, hit in enumerate(pattern):
            state["forward"], state["decided"] = f, False
            reference.hits, model.hits = [hit], [hit]
            assert torch.equal(model(x), reference(x)), (f, pattern)
            stats = streamer.take_step_stats()
            assert stats.sync_fetches == 0, (f, pattern)  # never a synchronous fetch
            skipped += stats.skipped_blocks
            if hit:  # after the decision, no copy of a block this forward skips: only the next forward's head
                assert all(m is head for fw, after, m in log if fw == f and after), (f, pattern)
    follower_streamed = sum(1 for b in streamed if b is not head)
    assert skipped == follower_streamed * sum(pattern)
    streamer.detach()


def _following(n: int, residency: BlockResidency, bus=None):
    """A `CachedToy` streamed under `residency`, its ring following the toy cache's decision (as `SkipFollower`:
    before the head ran, the previous forward's); returns (model, streamer, the cache's `skip` answers so far)."""
    model = CachedToy(n)
    streamer = LayerwiseStreamer(model.block_lists(), "cpu", residency=residency, bus=bus)
    head = model.all_blocks()[0]
    asked = [0]

    def skips(m: torch.nn.Module) -> bool:
        asked[0] += 1
        return model.hit and m is not head

    model.decided = streamer.follow_skips(skips)
    streamer.attach()
    streamer.take_step_stats()
    return model, streamer, asked


def test_a_hit_forward_asks_the_cache_about_each_block_a_few_times_not_once_per_block_pair():
    """The ring's own work on a hit is what a short step pays beyond the resident model: linear in the blocks."""
    n = 40
    model, streamer, asked = _following(n, BlockResidency.leading(n, 0, 2))
    x = torch.randn(2, DIM, generator=torch.Generator().manual_seed(1))
    per_forward = []
    with torch.no_grad():
        for hit in (False, True, True, False, True):
            model.hits, asked[0] = [hit], 0
            model(x)
            per_forward.append(asked[0])
            assert streamer.take_step_stats().sync_fetches == 0
    streamer.detach()
    assert max(per_forward) <= 4 * n, per_forward  # it was about 2·n² (every skipped block rescanned the ring)


def test_a_skipped_block_is_not_timed_as_compute():
    """A trace's compute track shows the blocks that ran: on a hit, the head alone; the rest is one skipped run."""
    from omni_console.offload.events import BlocksSkipped, BlockTiming, EventBus

    n, bus = 6, EventBus()
    model, streamer, _ = _following(n, BlockResidency.leading(n, 0, 2), bus)
    names = streamer.block_names
    x = torch.randn(2, DIM, generator=torch.Generator().manual_seed(1))
    timed = []
    with torch.no_grad():
        for hit in (False, True):
            sub = bus.subscribe()
            model.hits = [hit]
            model(x)
            streamer.take_step_stats(wait=True)
            events = sub.drain()
            timed.append([e.target for e in events if isinstance(e, BlockTiming) and e.kind == "compute"])
    streamer.detach()
    assert timed[0] == names and timed[1] == names[:1]
    assert [(e.first, e.last) for e in events if isinstance(e, BlocksSkipped)] == [(names[1], names[-1])]


@pytest.mark.parametrize("placement", ["leading", "spread"])
def test_with_the_probe_block_resident_a_hit_step_copies_nothing_and_the_next_miss_finds_its_blocks(placement):
    """The probe (head) block resident: a hit runs it from the device and passes the rest, so nothing crosses the
    link; the streamed blocks the next miss needs first are still in their slots (no synchronous fetch), and a
    miss moves each streamed block once. Exact throughout."""
    n, slots = 7, 2
    residency = BlockResidency.placed(placement, n, 1, slots)
    assert residency.resident[0]  # either placement keeps the probe (first block) resident first
    model, streamer, _ = _following(n, residency)
    reference = CachedToy(n)
    streamed_bytes = sum(b.region_nbytes for b in streamer.streamed_blocks)
    x = torch.randn(2, DIM, generator=torch.Generator().manual_seed(1))
    pattern = (False, True, True, False, True, False, False)
    moved = []
    with torch.no_grad():
        for hit in pattern:
            model.hits, reference.hits = [hit], [hit]
            assert torch.equal(model(x), reference(x))
            stats = streamer.take_step_stats()
            assert stats.sync_fetches == 0
            moved.append((stats.transfers, stats.h2d_bytes))
    streamer.detach()
    assert [m for m, hit in zip(moved, pattern, strict=True) if hit] == [(0, 0)] * 3
    assert all(b == streamed_bytes for (_, b), hit in zip(moved[1:], pattern[1:], strict=True) if not hit)
