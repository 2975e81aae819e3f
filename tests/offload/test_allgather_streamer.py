"""AllGather streaming on the gloo backend with two processes: every rank's output is bit-identical to
the plain model, for leading and spread placements and several ring depths, and each rank pins about
half of the streamed bytes."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
from offload_toy_models import ToyModel  # noqa: E402

from omni_console.offload.residency import BlockResidency  # noqa: E402

DIM = 32
N = 6
CASES = [("leading", 0, 2), ("leading", 2, 3), ("spread", 3, 2), ("spread", 1, 4)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from omni_console.offload.allgather_streamer import AllGatherStreamer
        from omni_console.offload.streamer import LayerwiseStreamer

        x = torch.randn(3, DIM, generator=torch.Generator().manual_seed(4))
        for placement, resident, slots in CASES:
            residency = BlockResidency.placed(placement, N, resident, slots)
            reference = ToyModel(N, DIM)
            single = LayerwiseStreamer(ToyModel(N, DIM).block_lists(), "cpu", residency=residency)
            single.attach()
            model = ToyModel(N, DIM)
            streamer = AllGatherStreamer(model.block_lists(), "cpu", residency=residency, group=None)
            streamer.attach()
            with torch.no_grad():
                expected = reference(x)
                outputs = [model(x) for _ in range(3)]  # the ring wraps across forwards
            results[(rank, placement, resident, slots)] = (
                all(torch.equal(o, expected) for o in outputs),
                streamer.shard_bytes, single.host_bytes, streamer.streamed_bytes, streamer.gathered_bytes,
            )
            streamer.detach()
            single.detach()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_stream_sharded_blocks_bit_identically():
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_rank_main, args=(2, _free_port(), results), nprocs=2, join=True)
    assert len(results) == 2 * len(CASES)
    for (rank, placement, resident, slots), (exact, shard, single, streamed, gathered) in results.items():
        assert exact, (rank, placement, resident, slots)
        assert streamed / 2 <= shard <= streamed / 2 + 6 * 256  # half the bytes, plus at most padding
        assert shard < single  # pinned per rank: about half of one process's arena
        assert gathered > 0  # the other rank supplied the rest of every block
