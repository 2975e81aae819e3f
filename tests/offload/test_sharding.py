"""AllGather sharding arithmetic against vLLM-Omni's examples, and its invariants."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_console.offload.sharding import Shard


def test_the_seed_examples():
    eight = torch.arange(100, 108)
    assert Shard(8, 4, 1).take(eight).tolist() == [102, 103]
    three = torch.arange(100, 103)
    assert Shard(3, 2, 1).take(three).tolist() == [102, 0]
    assert Shard(3, 2, 0).take(three).tolist() == [100, 101]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(1, 8))
def test_gathering_every_rank_rebuilds_the_block_then_zeros(total, world):
    full = torch.arange(1, total + 1)
    gathered = torch.cat([Shard(total, world, r).take(full) for r in range(world)])
    assert gathered.numel() == Shard(total, world, 0).gathered
    assert torch.equal(gathered[:total], full)
    assert not gathered[total:].any()  # only padding after the block
    assert Shard(total, world, 0).size == -(-total // world)


def test_a_rank_outside_the_world_is_refused():
    with pytest.raises(ValueError, match="not in a world"):
        Shard(8, 2, 2)
