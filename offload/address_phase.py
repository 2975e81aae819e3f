"""Keep a CPU copy of a weight at its source's address modulo one page.

CPU math libraries pick a kernel, and with it a summation order, by the alignment of their
operands. Seen with BLAS on AVX-512 machines: staged text encoders copied to 64-byte aligned memory
gave one pixel in 12 288 off by one against the plain pipeline, which computes on the weights
where safetensors placed them. A copy whose address equals the source's modulo a page runs the
very kernels the plain pipeline runs, so outputs stay bit-identical on any x86-64 CPU.

On CUDA the kernels read device memory, whose alignment the caching allocator fixes, so device
copies are allocated as they come and host arenas stay exact-size. Streamed DiT blocks keep their
packed layout on the CPU too (their slots are the exact-size arena's layout): on the AVX-512 machine
that showed the encoder difference, streamed blocks matched the plain pipeline bit for bit.
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
