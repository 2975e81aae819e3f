"""The block arena keeps each weight at its file address modulo a page on a CPU, and only there.

A plain pipeline computes on weights mapped from the safetensors file; CPU kernels choose their path
by alignment, so the engine's copies must sit at the same page phase (`offload.address_phase`). On
CUDA the layout stays compact: 256-byte aligned offsets, blocks back to back.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from omni_console.engine.loading.direct_load import read_locations
from omni_console.offload import arena_fill
from omni_console.offload.address_phase import PAGE, empty_at_phase, phase_of
from omni_console.offload.block_packing import Block, bind_region
from omni_console.offload.deferred_weights import DeferredWeights, Source
from omni_console.offload.pinned import ALIGNMENT, align_up

# odd sizes, mixed dtypes: the tensors' file offsets fall at many different phases
SHAPES = {"a": ((3, 5), torch.float32), "b": ((7,), torch.float16), "c": ((33, 9), torch.float32),
          "d": ((1, 3), torch.bfloat16), "e": ((129,), torch.float32)}


def _checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    values = {f"{blk}.{n}": torch.randn(shape, generator=g).to(dtype)
              for blk in ("0", "1") for n, (shape, dtype) in SHAPES.items()}
    path = tmp_path / "w.safetensors"
    save_file(values, path)
    return path, values


def _blocks(path: Path, weights: DeferredWeights, *, keep_phase: bool) -> tuple[list[Block], dict]:
    """Two blocks whose parameters are empty host tensors waiting for their bytes in `path`."""
    stored = read_locations(path)
    fd = os.open(path, os.O_RDONLY)
    weights.own_fd(fd)
    blocks, params = [], {}
    for blk in ("0", "1"):
        module = torch.nn.Module()
        for n, (shape, dtype) in SHAPES.items():
            found = stored[f"{blk}.{n}"]
            empty = (empty_at_phase(shape, dtype, phase_of(found.offset, dtype.itemsize)) if keep_phase
                     else torch.empty(shape, dtype=dtype))
            p = torch.nn.Parameter(empty, requires_grad=False)
            module.register_parameter(n, p)
            weights.add(p, Source(fd, found.offset, found.nbytes, found.dtype, found.shape))
            params[f"{blk}.{n}"] = (p, found.offset)
        blocks.append(Block(blk, module, resident=False))
    return blocks, params


def test_cpu_arena_places_each_weight_at_its_file_phase(tmp_path: Path) -> None:
    path, values = _checkpoint(tmp_path)
    assert len({read_locations(path)[k].offset % PAGE for k in values}) > 5
    weights = DeferredWeights(2, keep_phase=True)
    blocks, params = _blocks(path, weights, keep_phase=True)
    cpu = torch.device("cpu")
    arena = arena_fill.lay_out(blocks, cpu, pin=False, weights=weights)
    arena_fill.fill(blocks, arena, cpu, pin=False, weights=weights, progress=None)
    assert arena.tensor.data_ptr() % PAGE == 0
    for b in blocks:  # bound where the streamer binds them: the arena, then a page-aligned slot
        assert b.region_offset % PAGE == 0
        bind_region(b, arena.tensor[b.region_offset : b.region_offset + b.region_nbytes])
        for n in SHAPES:
            p, file_offset = params[f"{b.name}.{n}"]
            assert p.data_ptr() % PAGE == file_offset % PAGE, n
            assert torch.equal(p, values[f"{b.name}.{n}"])
    weights.close()
    arena.close()


def test_cuda_layout_stays_compact(tmp_path: Path) -> None:
    path, _ = _checkpoint(tmp_path)
    weights = DeferredWeights(2)
    blocks, params = _blocks(path, weights, keep_phase=False)
    arena = arena_fill.lay_out(blocks, torch.device("cuda"), pin=False, weights=weights)
    cursor = 0
    for b in blocks:
        assert b.region_offset == cursor
        offset = 0
        for x in b.bindings:  # back to back at 256-byte boundaries, in parameter order
            assert x.offset == offset
            offset = align_up(offset + x.target.numel() * x.dtype.itemsize, ALIGNMENT)
        assert b.region_nbytes == offset
        cursor = align_up(cursor + b.region_nbytes, ALIGNMENT)
    assert arena.nbytes == cursor
    weights.close()
    arena.close()
