"""Keep a CPU copy of a weight at its source's address modulo one page.

CPU math libraries pick a kernel, and with it a summation order, by the alignment of their
operands. Seen with BLAS on AVX-512 machines: staged text encoders copied to 64-byte aligned memory
gave one pixel in 12 288 off by one against the plain pipeline, which computes on the weights
where safetensors placed them; and a small Wan DiT (2 heads x 8, ffn 32) whose weights were read
to 64/256-byte aligned memory came out ~3e-7 off, under every policy. A copy whose address equals
the source's modulo a page runs the very kernels the plain pipeline runs, so outputs stay
bit-identical on any x86-64 CPU.

The plain pipeline's weights are mapped from their file: address = a page-aligned mapping + the
tensor's offset in the file. So on a CPU device (`DeferredWeights.keep_phase`):
- staged encoders and VAEs keep their source's phase (`place_like`, `phase_of`: `offload.stager`);
- a DiT's or UNet's weights read straight from their files are built as empty host tensors at the
  file offset's phase (`empty_at_phase`: `engine.loading.direct_load`, and `arena_views` for one arena),
  which a non-block tensor or an unpacked resident block computes on as it is;
- in the block arena each such tensor starts at that phase (`at_phase`: `block_packing.plan_block`)
  inside a region that starts on a page (`arena_fill.lay_out`), and the ring's slots and resident
  blocks' buffers start on a page (`device_bytes` via `place_like`), so a block keeps its phases
  wherever it is bound.

On CUDA the kernels read device memory, whose alignment the caching allocator fixes: device copies
are allocated as they come, and host arenas and the block layout stay exact-size (256-byte offsets).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

PAGE = 4096


def phase_of(ptr: int, itemsize: int) -> int:
    """`ptr` modulo a page, or 0 where `ptr` is not even aligned to its element size."""
    return ptr % PAGE if ptr % itemsize == 0 else 0


def device_bytes(nbytes: int, device: torch.device) -> torch.Tensor:
    """Plain uint8 storage: the `allocate` of `place_like` for slots and device buffers."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def at_phase(cursor: int, phase: int) -> int:
    """The first offset from `cursor` on that is `phase` modulo a page (in a page-aligned region)."""
    return cursor + (phase - cursor) % PAGE


def empty_at_phase(shape: tuple[int, ...], dtype: torch.dtype, phase: int) -> torch.Tensor:
    """An empty contiguous host tensor whose address is `phase` modulo a page."""
    nbytes = math.prod(shape) * dtype.itemsize
    raw = place_like(lambda n, _d: torch.empty(n, dtype=torch.uint8), nbytes, torch.device("cpu"), phase)
    return raw.view(dtype).view(shape)


def place_like(allocate: Callable[[int, torch.device], torch.Tensor], nbytes: int, device: torch.device,
               phase: int) -> torch.Tensor:
    """`nbytes` of uint8 storage from `allocate`; on a CPU device its address is `phase` modulo a page."""
    if device.type != "cpu":
        return allocate(nbytes, device)
    raw = allocate(nbytes + PAGE, device)
    start = (phase - raw.data_ptr()) % PAGE
    return raw[start : start + nbytes]
