"""An AllGather rank's shards are read in batches and page-locked shard by shard while the next batch is
read (as one GPU's arena is), each shard its own page-aligned registration, so a shard's host→device
copy never leaves its range. One gloo rank in this process; the registration is a stand-in for
`cudaHostRegister` (no GPU here), the reads are real."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from omni_console.engine.loading.direct_load import build_deferred
from omni_console.engine.loading.loader import load_component, load_dtype
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.offload import allgather_streamer, pinned
from omni_console.offload.deferred_weights import DeferredWeights
from omni_console.offload.options import LoadOptions
from omni_console.offload.pinned import PAGE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_gloo_rank():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_shards_are_page_locked_batch_by_batch_each_its_own_range(demo_model_dir: Path, one_gloo_rank: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    info = next(c for c in discover_model(demo_model_dir).components if c.role == "dit")
    weights = DeferredWeights(2)
    dit, why = build_deferred(info, load_dtype(info), weights)
    assert dit is not None, why
    events: list[tuple[str, int, int]] = []  # ("read" | "register", start, bytes) in the order they happened
    lock = threading.Lock()

    def register(self: pinned.HostArena, ptr: int, nbytes: int) -> None:
        with lock:
            events.append(("register", ptr - self.tensor.data_ptr(), nbytes))
            self._registered.append((ptr, nbytes))

    class Cudart:  # undoing the stand-in registrations at release
        @staticmethod
        def cudaHostUnregister(ptr: int) -> int:  # noqa: N802 - CUDA's name
            return 0

    submit_parts = DeferredWeights.submit_parts

    def noted_submit(self: DeferredWeights, jobs, pool, stop, progress=None):  # type: ignore[no-untyped-def]
        with lock:
            events.append(("read", 0, sum(dest.numel() for _, _, dest in jobs)))
        return submit_parts(self, jobs, pool, stop, progress)

    monkeypatch.setattr(pinned.HostArena, "_register", register)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart)
    monkeypatch.setattr(DeferredWeights, "submit_parts", noted_submit)
    lists = [(a, list(getattr(dit, a))) for a in ("transformer_blocks", "single_transformer_blocks")]
    streamer = allgather_streamer.AllGatherStreamer(lists, "cpu", group=None, weights=weights, resident_layers=0,
                                                    load_options=LoadOptions(batch_bytes=1))  # a batch per block
    streamer._pin = True  # as on CUDA
    streamer.attach()
    try:
        arena = streamer.filler.arena
        assert arena is not None and arena.pinned
        shards = sorted((offset, shard.size) for shard, offset in streamer.filler.shards.values())
        registered = sorted((lo, n) for kind, lo, n in events if kind == "register")
        assert registered == shards  # each shard its own range, nothing else
        assert all(lo % PAGE == 0 for lo, _ in registered)  # page-aligned: no two ranges share a page
        kinds = [kind for kind, _, _ in events]
        assert kinds.count("read") == len(shards) > 1
        last_read = len(kinds) - 1 - kinds[::-1].index("read")
        assert kinds.index("register") < last_read  # page-locking began before the last batch was read
        blocks = [t for name, t in load_component(info).state_dict().items()
                  if name.startswith(("transformer_blocks", "single_transformer_blocks"))]
        assert sum(n for kind, _, n in events if kind == "read") == sum(t.nbytes for t in blocks)  # each byte once
    finally:
        streamer.detach()
        weights.close()
