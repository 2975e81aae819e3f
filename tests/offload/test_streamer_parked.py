"""Parked blocks: two block sets of which one runs per forward (two experts) share one ring; the idle set
is out of the ring with only its masters in the arena, and `replan(..., active=)` swaps the sets exactly."""

from __future__ import annotations

import pytest
import torch
from offload_toy_models import ToyModel

from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer

DIM = 32
N = 4  # blocks per expert


def _input() -> torch.Tensor:
    return torch.randn(3, DIM, generator=torch.Generator().manual_seed(5))


def _residency(active: int, resident: int) -> tuple[BlockResidency, tuple[bool, ...]]:
    own = BlockResidency.leading(N, resident)
    flags = [False] * (2 * N)
    flags[active * N:(active + 1) * N] = own.resident
    mask = tuple(active * N <= i < (active + 1) * N for i in range(2 * N))
    return BlockResidency(tuple(flags), own.slots or 1, "leading"), mask


@pytest.mark.parametrize("resident", [0, 1, N])
def test_the_running_expert_streams_alone_and_the_swap_is_exact(resident):
    experts = [ToyModel(N, DIM, seed=1), ToyModel(N, DIM, seed=2)]
    references = [ToyModel(N, DIM, seed=1), ToyModel(N, DIM, seed=2)]
    residency, active = _residency(0, resident)
    streamer = LayerwiseStreamer([(f"e{i}.{name}", blocks) for i, m in enumerate(experts)
                                  for name, blocks in m.block_lists()], "cpu", residency=residency,
                                 keep_masters=True, active=active)
    streamer.attach()
    x = _input()
    regions = {name: nbytes for name, _, nbytes in streamer.block_states()}
    assert streamer.host_bytes >= sum(regions.values())  # both experts' masters, resident blocks' too
    with torch.no_grad():
        expected = [r(x) for r in references]
        for turn in (0, 1, 0):
            if turn != streamer.active.index(True) // N:
                stats = streamer.replan(*_residency(turn, resident))
                assert stats.copied_bytes == stats.freed_bytes  # the experts have the same resident share
            states = dict((name, state) for name, state, _ in streamer.block_states())
            idle = [name for name in states if not name.startswith(f"e{turn}.")]
            assert all(states[name] == "host" for name in idle) and streamer.num_parked == N
            assert all(t.numel() == 0 for i in range(N) for t in experts[1 - turn].all_blocks()[i].parameters())
            streamer.take_step_stats()
            for _ in range(2):
                assert torch.equal(experts[turn](x), expected[turn])
            stats = streamer.take_step_stats()
            if resident == N or N - resident <= streamer.num_slots:  # the ring holds the streamed blocks
                assert stats.h2d_bytes == 0
            else:  # each streamed block once per forward (its aligned region); the idle expert's never
                own = sum(regions[f"e{turn}.{b}"] for b in _streamed_names(resident))
                assert stats.transfers == 2 * (N - resident) and stats.h2d_bytes >= 2 * own
    streamer.detach()


def _streamed_names(resident: int) -> list[str]:
    n_a = (N + 1) // 2
    names = [f"blocks_a.{i}" for i in range(n_a)] + [f"blocks_b.{i}" for i in range(N - n_a)]
    return names[resident:]


def test_parking_needs_the_masters():
    model = ToyModel(N, DIM)
    with pytest.raises(ValueError, match="keep_masters"):
        LayerwiseStreamer(model.block_lists(), "cpu", residency=BlockResidency.leading(N, 0),
                          active=(True, True, False, False))


def test_a_swap_releases_the_old_share_before_it_copies_the_new(monkeypatch):
    """Handing the budget over either way never holds both experts' resident blocks at once."""
    experts = [ToyModel(N, DIM, seed=1), ToyModel(N, DIM, seed=2)]
    streamer = LayerwiseStreamer([(f"e{i}.{name}", blocks) for i, m in enumerate(experts)
                                  for name, blocks in m.block_lists()], "cpu", residency=_residency(0, 2)[0],
                                 keep_masters=True, active=_residency(0, 2)[1])
    streamer.attach()
    order: list[str] = []
    make, drop = streamer._make_resident, streamer._drop_resident
    monkeypatch.setattr(streamer, "_make_resident", lambda b: (order.append("copy"), make(b))[1])
    monkeypatch.setattr(streamer, "_drop_resident", lambda b: (order.append("free"), drop(b))[1])
    for turn in (1, 0):
        order.clear()
        streamer.replan(*_residency(turn, 2))
        assert order == ["free", "free", "copy", "copy"], turn
    streamer.detach()
