"""Live re-plan of the streamer: any sequence of residencies, placements and ring depths, carried out
from the arena's masters, stays bit-exact and moves only the blocks whose residency changed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from offload_toy_models import ToyModel

from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer

DIM = 32
N = 7


def _input() -> torch.Tensor:
    return torch.randn(3, DIM, generator=torch.Generator().manual_seed(9))


def _kept(model: ToyModel, residency: BlockResidency) -> LayerwiseStreamer:
    streamer = LayerwiseStreamer(model.block_lists(), "cpu", residency=residency, keep_masters=True)
    streamer.attach()
    return streamer


residencies = st.builds(BlockResidency.placed, st.sampled_from(["leading", "spread"]), st.just(N),
                        st.integers(0, N), st.integers(2, 5))


@settings(max_examples=25, deadline=None)
@given(st.lists(residencies, min_size=1, max_size=4))
def test_any_sequence_of_replans_is_bit_identical(sequence):
    reference = ToyModel(N, DIM)
    model = ToyModel(N, DIM)
    streamer = _kept(model, BlockResidency.leading(N, 0))
    arena = streamer.host_bytes
    x = _input()
    with torch.no_grad():
        expected = reference(x)
        assert torch.equal(model(x), expected)
        for residency in sequence:
            streamer.replan(residency)
            assert streamer.residency == residency and streamer.host_bytes == arena  # nothing repacked
            states = [state == "resident" for _, state, _ in streamer.block_states()]
            assert states == list(residency.resident)
            for _ in range(2):
                assert torch.equal(model(x), expected)
    streamer.detach()


def test_replan_moves_only_the_blocks_that_change():
    model = ToyModel(N, DIM)
    streamer = _kept(model, BlockResidency.leading(N, 2))
    sizes = {name: nbytes for name, _, nbytes in streamer.block_states()}
    names = list(sizes)
    with torch.no_grad():
        model(_input())
    stats = streamer.replan(BlockResidency.leading(N, 4))
    assert stats.copied_bytes >= sizes[names[2]] + sizes[names[3]] and stats.freed_bytes == 0
    assert stats.copied_bytes < sum(sizes.values())
    back = streamer.replan(BlockResidency.leading(N, 0))
    assert back.copied_bytes == 0 and back.freed_bytes >= sum(sizes[n] for n in names[:4])
    assert back.ring_bytes > 0 and stats.seconds >= 0
    streamer.detach()


def test_masters_hold_every_block_and_without_them_replan_is_refused():
    model = ToyModel(N, DIM)
    kept = _kept(model, BlockResidency.leading(N, 3))
    all_blocks = sum(nbytes for _, _, nbytes in kept.block_states())
    assert kept.host_bytes >= all_blocks  # the resident blocks' masters are in the arena too
    kept.detach()
    plain = LayerwiseStreamer(ToyModel(N, DIM).block_lists(), "cpu", residency=BlockResidency.leading(N, 3))
    plain.attach()
    assert plain.host_bytes < all_blocks
    with pytest.raises(RuntimeError, match="live re-plan"):
        plain.replan(BlockResidency.leading(N, 0))
    plain.detach()
