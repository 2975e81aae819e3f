"""AllGather streaming's CUDA path on one GPU (an NCCL group of one): shard copies on the copy stream,
gathers on their own stream, compute waiting on them. Outputs stay bit-identical to the resident model
for every shard-buffer count, gather-stream priority, ring depth and in-place gathers, across forwards
(the ring wraps)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from offload_toy_models import ToyModel  # noqa: E402

from omni_console.offload.allgather_streamer import AllGatherStreamer  # noqa: E402
from omni_console.offload.options import StreamOptions  # noqa: E402
from omni_console.offload.residency import BlockResidency  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

DIM = 512
N = 6
DEV = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def nccl_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=DEV)
    yield None
    dist.destroy_process_group()


@pytest.mark.parametrize(("buffers", "priority", "slots", "in_place"),
                         [(1, 0, 2, False), (2, 0, 2, False), (3, -1, 2, False), (2, -1, 4, False),
                          (2, 0, 2, True), (2, -1, 3, True)])
@pytest.mark.cuda
@needs_cuda
def test_gathered_blocks_compute_exactly_as_resident_ones(nccl_group, buffers, priority, slots, in_place):
    x = torch.randn(8, DIM, generator=torch.Generator().manual_seed(3)).to(DEV)
    reference = ToyModel(N, DIM).to(DEV)
    model = ToyModel(N, DIM)
    model.embed.to(DEV)
    model.out.to(DEV)
    streamer = AllGatherStreamer(model.block_lists(), DEV, residency=BlockResidency.leading(N, 0, slots),
                                 group=nccl_group, stream_options=StreamOptions(
                                     shard_buffers=buffers, comm_priority=priority, gather_in_place=in_place))
    streamer.attach()
    try:
        with torch.no_grad():
            expected = reference(x)
            outputs = [model(x) for _ in range(3)]
        torch.cuda.synchronize()
        assert all(torch.equal(o, expected) for o in outputs)
        assert streamer.take_step_stats().h2d_bytes > 0  # the blocks did stream
    finally:
        streamer.detach()


def test_no_shard_buffers_is_refused():
    with pytest.raises(ValueError, match="shard_buffers"):
        AllGatherStreamer(ToyModel(2, 8).block_lists(), "cpu", resident_layers=0, group=None,
                          stream_options=StreamOptions(shard_buffers=0))
