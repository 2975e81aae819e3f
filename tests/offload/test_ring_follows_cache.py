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
