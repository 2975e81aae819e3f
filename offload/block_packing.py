"""How a DiT block's tensors are laid out in one aligned host region, and copied there.

A block's tensors are grouped by storage and then into clusters of overlapping byte ranges: a
cluster (tied views, a buffer viewing a weight) is packed as one span so aliasing survives, while
unrelated tensors that merely live in one big storage are packed separately. Each tensor keeps a
`Binding` (its offset, dtype, shape and stride inside the region), so the same region can be bound
from the host arena, a device slot or a resident device buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .address_phase import at_phase, phase_of
from .devices import placeholder, rebind, storage_bytes, storage_key
from .pinned import ALIGNMENT, align_up, contiguous_stride, is_dense, span_elements, typed_view

_GROUP_ALIGN = 16  # storage-group starts are rounded down to this so every dtype stays aligned


@dataclass(slots=True)
class Binding:
    target: torch.Tensor
    offset: int  # byte offset inside the block region (and inside a slot)
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(slots=True)
class Piece:
    """Bytes copied into the arena at pack time: a raw storage span, or one tensor's values."""

    offset: int  # inside the block region
    nbytes: int
    source: torch.Tensor
    raw: bool  # True: `source` is a uint8 storage span; False: a tensor copied with its values
    binding: Binding | None = None
    deferred: bool = False  # `source` is still in its file: read into the arena, never copied


@dataclass(slots=True)
class Block:
    name: str
    module: torch.nn.Module
    resident: bool
    tensor_bytes: int = 0
    region_offset: int = 0
    region_nbytes: int = 0
    bindings: list[Binding] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list)
    slot: int | None = None  # slot its tensors currently point into
    packed: bool = False
    device_buffer: torch.Tensor | None = None  # a resident block's own device copy of its region


def bind_region(b: Block, region: torch.Tensor) -> None:
    """Point every tensor of the block at its place in `region` (a slot, a device buffer, the arena)."""
    for x in b.bindings:
        rebind(x.target, lambda x=x: typed_view(region, x.offset, x.dtype, x.shape, x.stride))


def unbind_region(b: Block, device: torch.device) -> None:
    for x in b.bindings:
        rebind(x.target, lambda x=x: placeholder(x.dtype, device))


def distinct_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the tensors, counting tensors that share one storage once (their union span)."""
    spans: dict[Any, tuple[int, int, int]] = {}
    for t in tensors:
        start = t.storage_offset() * t.element_size()
        end = start + span_elements(t.shape, t.stride()) * t.element_size()
        key = storage_key(t)
        lo, hi, n = spans.get(key, (start, end, 0))
        spans[key] = (min(lo, start), max(hi, end), n + t.numel() * t.element_size())
    return sum(min(hi - lo, n) for lo, hi, n in spans.values())


def byte_range(t: torch.Tensor) -> tuple[int, int]:
    start = t.storage_offset() * t.element_size()
    return start, start + span_elements(t.shape, t.stride()) * t.element_size()


def clusters(tensors: Sequence[torch.Tensor]) -> list[tuple[list[torch.Tensor], int, int]]:
    """Tensors of one storage grouped into runs of overlapping byte ranges: (tensors, lo, hi)."""
    out: list[tuple[list[torch.Tensor], int, int]] = []
    for t in sorted(tensors, key=lambda t: byte_range(t)[0]):
        start, end = byte_range(t)
        if out and start < out[-1][2]:
            members, lo, hi = out[-1]
            out[-1] = ([*members, t], lo, max(hi, end))
        else:
            out.append(([t], start, end))
    return out


def reject_shared_ranges(claims: list[tuple[Any, int, int, str]]) -> None:
    """Two blocks using overlapping bytes of one storage cannot be streamed independently."""
    by_key: dict[Any, list[tuple[int, int, str]]] = {}
    for key, lo, hi, name in claims:
        by_key.setdefault(key, []).append((lo, hi, name))
    for ranges in by_key.values():
        ranges.sort()
        reach, owner = -1, ""
        for lo, hi, name in ranges:
            if lo < reach and name != owner:
                raise ValueError(f"{name} shares weight storage with {owner}; shared weights cannot be streamed")
            if hi > reach:
                reach, owner = hi, name


def unique_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out



def plan_block(b: Block, claims: list[tuple[Any, int, int, str]], device: torch.device,
               deferred: Callable[[torch.Tensor], bool] | None = None, keep_phase: bool = False) -> None:
    """Decide where each tensor of the block goes inside its region (no copying yet).

    Tensors are grouped by storage and then into clusters of overlapping byte ranges: a cluster
    (tied views, a buffer viewing a weight) is packed as one span so aliasing survives, while
    unrelated tensors that merely live in one big storage are packed separately. Each cluster's
    range is recorded in `claims` so ranges used by two blocks can be rejected. A tensor for which
    `deferred` is true is still in its file and gets a region of its own (`deferred_pieces`).

    With `keep_phase` on a CPU device a deferred tensor starts at its empty host tensor's address modulo a page (its
    file's phase: `engine.loading.direct_load`) instead of the next 256-byte boundary, in a region laid out
    from a page boundary (`arena_fill.lay_out`), so CPU kernels run on the plain pipeline's alignment
    (`offload.address_phase`). On CUDA the layout stays compact.
    """
    groups: dict[Any, list[torch.Tensor]] = {}
    cursor = 0
    keep_phase = keep_phase and device.type == "cpu"
    for t in unique_tensors(b.module):
        if t.is_meta:
            raise ValueError(f"{b.name}: cannot stream a meta tensor (weights not loaded)")
        if deferred is not None and deferred(t):  # read straight into its place (`offload.deferred_weights`)
            cursor = (at_phase(cursor, phase_of(t.data_ptr(), t.element_size())) if keep_phase
                      else align_up(cursor, ALIGNMENT))
            shape = tuple(t.shape)
            nbytes = t.numel() * t.element_size()
            binding = Binding(t, cursor, t.dtype, shape, contiguous_stride(shape))
            b.pieces.append(Piece(cursor, nbytes, t, raw=False, binding=binding, deferred=True))
            b.bindings.append(binding)
            b.tensor_bytes += nbytes
            cursor += nbytes
            continue
        if t.numel() == 0:
            rebind(t, lambda t=t: t.detach().to(device))
            continue
        groups.setdefault(storage_key(t), []).append(t)
    for key, ts in groups.items():
        for cluster, lo, hi in clusters(ts):
            claims.append((key, lo, hi, b.name))
            cursor = align_up(cursor, ALIGNMENT)
            if len(cluster) == 1 and not is_dense(cluster[0]):
                t = cluster[0]
                shape = tuple(t.shape)
                nbytes = t.numel() * t.element_size()
                binding = Binding(t, cursor, t.dtype, shape, contiguous_stride(shape))
                b.pieces.append(Piece(cursor, nbytes, t, raw=False, binding=binding))
                b.bindings.append(binding)
            else:
                lo = lo // _GROUP_ALIGN * _GROUP_ALIGN
                nbytes = hi - lo
                b.pieces.append(Piece(cursor, nbytes, storage_bytes(cluster[0])[lo:hi], raw=True))
                for t in cluster:
                    start = t.storage_offset() * t.element_size()
                    shape, stride = tuple(t.shape), tuple(t.stride())
                    b.bindings.append(Binding(t, cursor + start - lo, t.dtype, shape, stride))
            b.tensor_bytes += nbytes
            cursor += nbytes
    b.region_nbytes = align_up(cursor, ALIGNMENT)

def deferred_pieces(b: Block, arena: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tensor, its bytes in the arena) for each of the block's tensors still in its file."""
    base = b.region_offset
    return [(p.binding.target, arena[base + p.offset : base + p.offset + p.nbytes])
            for p in b.pieces if p.deferred and p.binding is not None]


def pack_block(b: Block, arena: torch.Tensor, device: torch.device) -> None:
    """Copy the block into its arena region, then drop the original tensors' storage.

    Tensors still in their files are skipped: the caller has read them in (`deferred_pieces`)."""
    base = b.region_offset
    for p in b.pieces:
        if p.deferred:
            continue  # read from its file by the caller
        if p.raw:
            arena[base + p.offset : base + p.offset + p.nbytes].copy_(p.source)
        else:
            x = p.binding
            assert x is not None
            # detached: weights keep requires_grad as from_pretrained leaves it; the arena records no graph
            typed_view(arena, base + x.offset, x.dtype, x.shape, x.stride).copy_(p.source.detach())
    b.pieces = []  # release references to the original storage
    b.packed = True
    for x in b.bindings:
        rebind(x.target, lambda x=x: placeholder(x.dtype, device))

