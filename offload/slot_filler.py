"""Where a ring slot's bytes come from: the `SlotFiller` protocol and the one-GPU host-copy filler.

A filler owns the host side of the streamed blocks (their arena, packed by `pack`) and the copy
stream, and fills a device slot with one block's packed region on request. The rings
(offload/slot_ring.py, offload/byte_ring.py) decide which block goes where and when; the filler only
moves the bytes. `HostCopyFiller` copies the region from the pinned arena (one memcpy);
`AllGatherFiller` (offload/allgather_filler.py) copies this rank's shard and gathers the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from . import arena_fill
from .block_packing import Block
from .copy_ledger import CopyLedger
from .deferred_weights import DeferredWeights
from .devices import current_stream, is_cuda, new_stream, stream_context
from .options import DEFAULT_LOAD, LoadOptions
from .pinned import HostArena


class SlotFiller(Protocol):
    """What a ring needs to fill its slots, and the streamer to pack and release the host side."""

    arena: HostArena | None
    copy_stream: Any

    def pack(self, packed: list[Block], *, pin: bool, weights: DeferredWeights | None,
             progress: Callable[[int, int], None] | None) -> None:
        """Lay the blocks' regions out in a host arena and fill it (read, copy, page-lock)."""

    def slot_nbytes(self, streamed: list[Block]) -> int:
        """Bytes of one ring slot: what the largest streamed block needs on the device."""

    def open(self) -> None:
        """Before the ring's first copy: its copy stream exists."""

    def fill(self, b: Block, out: torch.Tensor, *, sync: bool, previous: Any) -> tuple[int, Any]:
        """Put block b's region at the start of `out`; returns (bytes over the host link, the copy's end
        event on CUDA or None). `previous` is the event of the copy that last wrote `out`, if any: a
        synchronous fill waits for it. An asynchronous fill runs after everything computed so far."""

    def release(self) -> None:
        """Free the device buffers and close the arena (detach, a failed attach)."""


class HostCopyFiller:
    """Each block's packed region copied from the (pinned) arena into the slot, one memcpy."""

    partial_pins = False  # a filler that can read refused blocks from elsewhere keeps the locked ones

    def __init__(self, device: torch.device, ledger: CopyLedger, load_options: LoadOptions = DEFAULT_LOAD) -> None:
        self.device = device
        self.cuda = is_cuda(device)
        self.arena: HostArena | None = None
        self.copy_stream: Any = None
        self._ledger = ledger
        self._clock = ledger.clock
        self._load_options = load_options  # how the arena is laid out, read and page-locked (arena_fill)

    def pack(self, packed: list[Block], *, pin: bool, weights: DeferredWeights | None,
             progress: Callable[[int, int], None] | None) -> None:
        options = self._load_options
        self.arena = arena_fill.lay_out(packed, self.device, pin=pin, weights=weights, options=options,
                                        partial=self.partial_pins)
        self._laid_out(packed, weights)
        arena_fill.fill(packed, self.arena, self.device, pin=pin, weights=weights, progress=progress, options=options)

    def _laid_out(self, packed: list[Block], weights: DeferredWeights | None) -> None:
        """Each block's pieces are planned and nothing is read yet (a subclass notes where they come from)."""

    def slot_nbytes(self, streamed: list[Block]) -> int:
        return max((b.region_nbytes for b in streamed), default=0)

    def open(self) -> None:
        if self.copy_stream is None:
            self.copy_stream = new_stream(self.device)

    def fill(self, b: Block, out: torch.Tensor, *, sync: bool, previous: Any) -> tuple[int, Any]:
        """Async copies run on the copy stream after the slot's previous user has computed; the returned
        event is what the block's pre-hook waits for."""
        arena = self.arena
        assert arena is not None
        n, off = b.region_nbytes, b.region_offset
        src = arena.tensor[off : off + n]
        dst = out[:n]
        clock = self._clock
        if not self.cuda:
            mark = clock.start()
            dst.copy_(src)
            clock.finish(mark, "copy", b.name, n, sync=sync)
            self._ledger.absorb(clock.poll())
            return n, None
        compute = current_stream(self.device)
        if sync:
            stream = compute
            if previous is not None:
                stream.wait_event(previous)  # an async copy may still write it
        else:
            stream = self.copy_stream
            stream.wait_stream(compute)  # the slot's previous user has finished computing
        with stream_context(stream):
            mark = clock.start(stream)
            dst.copy_(src, non_blocking=arena.pinned and not sync)
            return n, clock.finish(mark, "copy", b.name, n, sync=sync, stream=stream)

    def release(self) -> None:
        self.copy_stream = None
        if self.arena is not None:
            self.arena.close()
