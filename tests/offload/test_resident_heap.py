"""Issue 35 (flux16's peak RSS 6.2 % over its forecast before the first request): a load that keeps no block
masters (`run --ram-budget`) reads each resident block from its files into the host tensors the model was built
with, then moves it to the device. Those tensors are many allocations under glibc's mmap threshold (a Flux
block's 18.9 MB projections), served from its heap, where freed pages stay in the process's RSS: without a trim
after each move, every resident block left that share behind until the load's end.

A CPU has no device to move to, so the device copy here is `off_host`: every tensor re-pointed at storage outside
the heap, which is what a GPU copy leaves on the host. Everything else is the streamer's own attach, reading a
safetensors file through `DeferredWeights` as a load does."""

from __future__ import annotations

import ctypes.util
from pathlib import Path

import pytest
import torch
from process_peak import reset_peak
from safetensors.torch import save_file

from omni_console.engine.loading.direct_load import add_sources, read_locations
from omni_console.offload import resident_blocks
from omni_console.offload.deferred_weights import DeferredWeights
from omni_console.offload.devices import rebind
from omni_console.offload.proc_status import status_bytes
from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer

MiB = 2**20
BLOCKS, LINEARS, WIDTH = 6, 6, 1024  # 4 MiB float32 weights, under any raised mmap threshold: heap-served
BLOCK_BYTES = LINEARS * WIDTH * WIDTH * 4

pytestmark = pytest.mark.skipif(ctypes.util.find_library("c") is None or not Path("/proc/self/status").exists(),
                                reason="glibc's heap and /proc's RSS figures are what this measures")


def _status(key: str) -> int:
    figure = status_bytes(key)
    assert figure is not None, key
    return figure


def off_host(tensors: list[torch.Tensor], device: torch.device) -> int:
    """The device move as the host sees it: each tensor's host storage goes (the device holds the bytes)."""
    moved = 0
    for t in tensors:
        moved += t.numel() * t.element_size()
        rebind(t, lambda t=t: torch.zeros((), dtype=t.dtype).expand(t.shape))
    return moved


def _blocks(path: Path, weights: DeferredWeights) -> list[torch.nn.Module]:
    """Blocks of Linear layers whose weights are empty host tensors waiting for their file ranges, as
    engine/loading/direct_load.py builds a DiT (allocated one per tensor, never written)."""
    stored = read_locations(path)
    blocks = []
    for i in range(BLOCKS):
        with torch.device("meta"):
            block = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LINEARS)))
        for j, layer in enumerate(block):
            layer.weight = torch.nn.Parameter(torch.empty(WIDTH, WIDTH), requires_grad=False)
            add_sources(weights, [(layer.weight, stored[f"{i}.{j}"])])
        blocks.append(block)
    return blocks


def _attach_holds_one_block_at_a_time(blocks: list[torch.nn.Module], weights: DeferredWeights) -> LayerwiseStreamer:
    """Attach every block resident without masters (each read, then moved) and check the host let each go: RSS grew
    by less than a block, and (where the peak can be reset) never held two. Returns the attached streamer."""
    every = BlockResidency((True,) * BLOCKS, slots=0)
    streamer = LayerwiseStreamer([("blocks", blocks)], "cpu", residency=every, pin=False, weights=weights)
    peak_known = reset_peak()
    before, start = _status("RssAnon"), _status("VmRSS")
    streamer.attach()
    # the peak against the RSS it started from: memory the rest of the process frees meanwhile (a test suite's
    # garbage) lowers the end, never the start
    grew, peak = _status("RssAnon") - before, _status("VmHWM") - start
    # every block was read from the file and left the host: only its device copy holds it
    assert weights.pending == 0 and streamer.num_resident == BLOCKS
    assert grew < BLOCK_BYTES, (f"RSS grew {grew / MiB:.0f} MiB after {BLOCKS * BLOCK_BYTES / MiB:.0f} MiB of "
                                "resident blocks left the host")
    if peak_known:  # one block's host copy at a time: what the host forecast's load read buffer names
        assert peak < 2 * BLOCK_BYTES, f"the attach peaked {peak / MiB:.0f} MiB above the RSS it started from"
    return streamer


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("resident_heap") / "blocks.safetensors"
    save_file({f"{i}.{j}": torch.full((WIDTH, WIDTH), float(i + j)) for i in range(BLOCKS) for j in range(LINEARS)},
              str(path))
    return path


def test_resident_blocks_moved_off_the_host_leave_no_heap_behind(weights_file: Path, monkeypatch):
    raised = torch.empty(16 * MiB, dtype=torch.uint8)  # freed, it raises glibc's mmap threshold past the weights'
    raised.fill_(1)  # size, as a process that imported torch and diffusers and read a checkpoint's headers has
    del raised
    monkeypatch.setattr(resident_blocks, "move_preserving_aliases", off_host)
    weights = DeferredWeights(2)
    try:
        blocks = _blocks(weights_file, weights)
        sentinel = torch.ones(MiB // 4)  # later allocations (the rest of the load) sit above the blocks in the heap
        streamer = _attach_holds_one_block_at_a_time(blocks, weights)
        assert all(layer.weight.stride() == (0, 0) for b in blocks for layer in b)
        streamer.detach()
        del sentinel
    finally:
        weights.close()


def test_resident_blocks_read_into_the_dits_arena_give_their_pages_back_as_each_moves(weights_file: Path,
                                                                                       monkeypatch):
    """A DiT built into one arena mapping (`dit_in_arena`): the resident blocks' weights are views into it, and the
    mapping stays as long as any view of it does (the streamed blocks' views, until their bytes are packed into the
    streamer's arena). Without giving each moved block's pages back, every resident block stayed in RSS until the
    load's end: 6.8 GB at the peak of flux16's load on an H100 (offload/page_release.py)."""
    from omni_console.offload.pinned import arena_views

    monkeypatch.setattr(resident_blocks, "move_preserving_aliases", off_host)
    weights = DeferredWeights(2)
    stored = read_locations(weights_file)
    arena, views = arena_views([((WIDTH, WIDTH), torch.float32)] * (BLOCKS * LINEARS + 1), huge_pages=False)
    still_viewed = views.pop()  # a view the rest of the load still holds (a streamed block's, before its packing)
    try:
        blocks = []
        for i in range(BLOCKS):
            with torch.device("meta"):
                block = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LINEARS)))
            for j, layer in enumerate(block):
                layer.weight = torch.nn.Parameter(views[i * LINEARS + j], requires_grad=False)
                add_sources(weights, [(layer.weight, stored[f"{i}.{j}"])])
            blocks.append(block)
        del views
        arena_object_goes = arena.tensor.untyped_storage()  # as the loader drops the arena object, its views keep it
        del arena
        streamer = _attach_holds_one_block_at_a_time(blocks, weights)
        still_viewed.fill_(3.0)  # the mapping's other views keep their bytes
        assert float(still_viewed[0, 0]) == 3.0 and arena_object_goes.nbytes() > BLOCKS * BLOCK_BYTES
        streamer.detach()
    finally:
        weights.close()
