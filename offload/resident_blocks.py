"""A streamer's block moves outside the ring: resident device copies from the arena (or, for a block in a file
tier, read from its file), a resident block that keeps no master moved to the device once, and putting the blocks
back on their arena regions after a failed attach (offload/streamer.py calls these)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .address_phase import device_bytes, place_like
from .block_packing import Block, bind_region, distinct_bytes, unbind_region, unique_tensors
from .deferred_weights import DeferredWeights
from .devices import current_stream, is_cuda, move_preserving_aliases, rebind
from .page_release import release_moved_pages
from .pinned import HostArena, typed_view
from .process_memory import release_freed_heap
from .slot_filler import SlotFiller
from .transfer_timing import TransferClock


def copy_resident(b: Block, arena: HostArena, device: torch.device, clock: TransferClock) -> int:
    """Give a packed block its own device copy of its arena region and bind it there; returns bytes copied.

    The copy is timed (a staging event) but is no ring transfer: it counts in no step's bytes."""
    n, off = b.region_nbytes, b.region_offset
    buffer = place_like(device_bytes, n, device, 0)  # CPU: on a page, as its region (`plan_block`)
    cuda = is_cuda(device)
    mark = clock.start(current_stream(device) if cuda else None)
    buffer.copy_(arena.tensor[off : off + n], non_blocking=arena.pinned)
    clock.finish(mark, "copy", b.name, n, sync=True, stream=current_stream(device) if cuda else None)
    b.device_buffer = buffer
    bind_region(b, buffer)
    return n


def read_resident(b: Block, filler: SlotFiller, device: torch.device) -> int:
    """Give a block whose master is its file (a page-cache or disk tier) its own device copy, read through
    the filler's bounce ring (offload/tier_filler.py) as a ring slot would be, and bind it there."""
    n = b.region_nbytes
    buffer = place_like(device_bytes, n, device, 0)
    filler.fill(b, buffer, sync=True, previous=None)
    b.device_buffer = buffer
    bind_region(b, buffer)
    return n


def move_resident(b: Block, weights: DeferredWeights | None, device: torch.device) -> int:
    """A resident block that keeps no host master (a load without live re-plan): read from its files into its own
    host tensors, moved to the device, and those host pages handed back to the kernel at once; returns its bytes.

    Why the hand-back: the host tensors were allocated one per weight when the model was built, and glibc serves
    those under its mmap threshold (up to 32 MiB: a Flux block's 3072x3072 projections, 18.9 MB each) from its
    heap, where freed memory stays resident. Each resident block then left that share behind until the load's
    end (151 MB a Flux double block, 57 MB a single one: 1.26 GB for issue 35's flux16 plan of 14 resident
    blocks, on top of the arena and the bounce rings), which no forecast names. Trimmed per block, the load
    holds one block's host copy at a time (the host forecast's load read buffer).

    A DiT built into one arena mapping (`dit_in_arena`) holds its resident blocks' host bytes there instead, where
    neither freeing nor trimming gives them back until the whole mapping goes at the load's end: their pages are
    released as each block moves (offload/page_release.py)."""
    if weights is not None:
        weights.materialize_module(b.module)
    tensors = unique_tensors(b.module)
    old = [t.detach() for t in tensors]  # the host bytes, held until their pages are given back
    if move_preserving_aliases(tensors, device):  # bytes left the host (0 on a CPU: the host copy is the device's)
        release_moved_pages(old)
        del old
        release_freed_heap()
    return distinct_bytes(tensors)


def drop_resident(b: Block, device: torch.device) -> int:
    """Free a resident block's device copy (its master stays in the arena); returns bytes freed."""
    n = b.device_buffer.numel() if b.device_buffer is not None else 0
    unbind_region(b, device)
    b.device_buffer = None
    return n


def restore_to_arena(blocks: Iterable[Block], arena: HostArena | None) -> None:
    """After a failed attach: each packed block's tensors back on its arena region (host weights kept
    while the arena is open), every block's packing forgotten."""
    for b in blocks:
        if not b.packed and not b.bindings:
            continue
        b.device_buffer = None
        if b.packed and arena is not None and not arena.closed:
            base = b.region_offset
            for x in b.bindings:
                rebind(
                    x.target,
                    lambda x=x, base=base: typed_view(arena.tensor, base + x.offset, x.dtype, x.shape, x.stride),
                )
        b.pieces, b.bindings, b.packed, b.slot = [], [], False, None
        b.tensor_bytes = b.region_nbytes = 0
