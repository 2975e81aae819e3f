"""AllGather DLO's slot filler: this rank's shard of each block copied host→device, the rest gathered.

`AllGatherStreamer` (offload/allgather_streamer.py) is a `LayerwiseStreamer` with this filler; the
rings are the same. The filler owns the shard arena (1/N of every streamed block's packed region,
pinned), the shard buffers the copies cycle through, and the communication stream the gathers run on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import torch
import torch.distributed as dist

from .arena_fill import batches, byte_progress
from .block_packing import Block, pack_block, plan_block, reject_shared_ranges
from .copy_ledger import CopyLedger
from .deferred_weights import DeferredWeights
from .devices import current_stream, is_cuda, new_stream, stream_context
from .options import DEFAULT_LOAD, DEFAULT_STREAM, LoadOptions, StreamOptions
from .pinned import ALIGNMENT, PAGE, HostArena, align_up
from .sharding import Shard


def gather_into(out: torch.Tensor, shard: torch.Tensor, group: Any) -> None:
    """`all_gather_into_tensor` (newer torch names it `all_gather_single`)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, shard, group=group)


class AllGatherFiller:
    """A `SlotFiller` for one rank of `group` (see offload/allgather_streamer.py for the protocol)."""

    def __init__(self, device: torch.device, ledger: CopyLedger, group: Any,
                 stream_options: StreamOptions = DEFAULT_STREAM, load_options: LoadOptions = DEFAULT_LOAD) -> None:
        """`stream_options.shard_buffers`: device buffers the shard copies cycle through (a copy waits
        for the gather that last read its buffer). `.comm_priority`: the gathers' stream priority
        (negative: ahead of compute's kernels, so a gather is not queued behind a block's).
        `.gather_in_place`: copy the shard into the slot and gather in place instead (no shard buffers)."""
        self.device = device
        self.cuda = is_cuda(device)
        self.arena: HostArena | None = None
        self.copy_stream: Any = None
        self._ledger = ledger
        self._clock = ledger.clock
        self._load_options = load_options
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.shards: dict[str, tuple[Shard, int]] = {}  # block name -> (its shard, offset in the arena)
        self._shard_buffers: list[torch.Tensor] = []
        self._buffers = stream_options.shard_buffers
        self._comm_priority = stream_options.comm_priority
        self._in_place = stream_options.gather_in_place
        self._buffer_free: list[Any] = [None] * self._buffers  # the gather that last read each buffer
        self._next_buffer = 0
        self._comm_stream: Any = None
        self.gathered_bytes = 0  # bytes other ranks supplied (NVLink on GPUs) since attach

    @property
    def shard_bytes(self) -> int:
        """Bytes of this rank's shards in the arena (about streamed bytes / N)."""
        return sum(shard.size for shard, _ in self.shards.values())

    def open(self) -> None:
        if self.copy_stream is None:
            self.copy_stream = new_stream(self.device)

    def pack(self, packed: list[Block], *, pin: bool, weights: DeferredWeights | None,
             progress: Callable[[int, int], None] | None) -> None:
        """Each block's region is laid out as on one GPU; only this rank's shard of it is kept. Tensors
        still in their files are read only where they overlap the shard: a rank reads ~1/N from disk."""
        claims: list[tuple[Any, int, int, str]] = []
        knows = weights.knows if weights is not None else None
        for b in packed:
            plan_block(b, claims, self.device, knows)
        reject_shared_ranges(claims)
        deferred = any(p.deferred for b in packed for p in b.pieces)
        step = PAGE if pin and deferred else ALIGNMENT  # pinned shard by shard: no two share a page
        cursor = 0
        for b in packed:
            shard = Shard(b.region_nbytes, self.world, self.rank)
            self.shards[b.name] = (shard, cursor)
            cursor = align_up(cursor + shard.size, step)
        self.arena = HostArena(cursor, pin=False, huge_pages=self._load_options.use_huge_pages)
        for b in packed:  # the last rank's padding is zeros, as vLLM-Omni pads (gaps between tensors are never read)
            shard, offset = self.shards[b.name]
            self.arena.tensor[offset + shard.stop - shard.start : offset + shard.size].zero_()
        reads: dict[str, list[tuple[torch.Tensor, int, torch.Tensor]]] = {}  # by block
        skipped: list[torch.Tensor] = []
        for b in packed:
            shard, offset = self.shards[b.name]
            dest = self.arena.tensor[offset : offset + shard.size]
            reads[b.name] = []
            for p in b.pieces:
                if not p.deferred or p.binding is None:
                    continue
                lo, hi = max(p.offset, shard.start), min(p.offset + p.nbytes, shard.stop)
                if lo < hi:
                    reads[b.name].append((p.binding.target, lo - p.offset, dest[lo - shard.start : hi - shard.start]))
                else:
                    skipped.append(p.binding.target)
            if any(not p.deferred for p in b.pieces):
                whole = torch.zeros(b.region_nbytes, dtype=torch.uint8)
                b.region_offset = 0
                pack_block(b, whole, self.device)  # the whole region on the host, then only our shard is kept
                dest[: shard.stop - shard.start].copy_(whole[shard.start : shard.stop])
        if deferred:
            self._read_in_batches(packed, reads, pin, weights, progress)
        elif pin:
            self.arena.pin()
        for b in packed:
            if not b.packed:
                pack_block(b, self.arena.tensor, self.device)  # all read above: re-points the tensors only
        if weights is not None:
            weights.forget(skipped)

    def _read_in_batches(self, packed: list[Block], reads: dict[str, list[tuple[torch.Tensor, int, torch.Tensor]]],
                         pin: bool, weights: DeferredWeights | None,
                         progress: Callable[[int, int], None] | None) -> None:
        """The shards' reads, about 2 GB at a time on one reader pool; with pinning, each batch's shards
        are page-locked on other threads (each shard its own range) while the next batch is read, as
        `arena_fill` does on one GPU: the load costs about the longer of the two, not their sum."""
        assert weights is not None
        landed = byte_progress(sum(b.tensor_bytes for b in packed), progress, scale=self.world)
        pending: list[Future[bool]] = []
        options = self._load_options
        with ThreadPoolExecutor(options.register_threads, thread_name_prefix="arena-register") as registrar:
            try:
                with weights.reader_pool() as readers:
                    for batch in batches(packed, options.batch_bytes, lambda b: self.shards[b.name][0].size):
                        jobs = [job for b in batch for job in reads[b.name]]
                        if jobs:
                            weights.submit_parts(jobs, readers, threading.Event(), landed).wait()
                        if pin:
                            ranges = [(offset, offset + shard.size)
                                      for shard, offset in (self.shards[b.name] for b in batch)]
                            pending.append(registrar.submit(self.arena.pin_ranges, ranges))
            finally:
                wait(pending)  # never close an arena a registration is still working on

    def slot_nbytes(self, streamed: list[Block]) -> int:
        return max((self.shards[b.name][0].gathered for b in streamed), default=0)

    def fill(self, b: Block, out: torch.Tensor, *, sync: bool, previous: Any) -> tuple[int, Any]:
        """Our shard host→device, then the gather of every rank's shard into `out`; returns (PCIe bytes,
        the gather's end event on CUDA)."""
        assert self.arena is not None
        shard, offset = self.shards[b.name]
        src = self.arena.tensor[offset : offset + shard.size]
        dst = out[: shard.gathered]
        done = None
        if not self.cuda:
            mark = self._clock.start()
            gather_into(dst, src, self.group)  # gloo: CPU tensors, synchronous
            self._clock.finish(mark, "copy", b.name, shard.size, sync=sync)
            self._ledger.absorb(self._clock.poll())
        else:
            compute = current_stream(self.device)
            if self._comm_stream is None:
                self._comm_stream = new_stream(self.device, self._comm_priority)
            copy = compute if sync else self.copy_stream
            comm = compute if sync else self._comm_stream
            if sync and previous is not None:
                compute.wait_event(previous)
            if self._in_place:
                mine, index = self._own_part_of_slot(dst, previous, shard, copy, compute, sync), None
            else:
                mine, index = self._next_shard_buffer(shard, copy)
            with stream_context(copy):
                mark = self._clock.start(copy)
                mine.copy_(src, non_blocking=self.arena.pinned and not sync)
                copied = self._clock.finish(mark, "copy", b.name, shard.size, sync=sync, stream=copy)
            comm.wait_stream(compute)
            comm.wait_event(copied)
            with stream_context(comm):
                gather_into(dst, mine, self.group)
                done = torch.cuda.Event()
                done.record(comm)
            if index is not None:
                self._buffer_free[index] = done
        self.gathered_bytes += shard.gathered - shard.size
        return shard.size, done

    def _next_shard_buffer(self, shard: Shard, copy: Any) -> tuple[torch.Tensor, int]:
        """Where our shard is copied by default: the next shard buffer, and its index. The copy waits
        only for that buffer's previous gather, not for compute: it runs while compute still uses the
        slot (the gather then waits for compute). The buffers rotate, made at the first copy."""
        if not self._shard_buffers:
            largest = max(part.size for part, _ in self.shards.values())
            self._shard_buffers = [torch.empty(largest, dtype=torch.uint8, device=self.device)
                                   for _ in range(self._buffers)]
        index = self._next_buffer
        self._next_buffer = (index + 1) % self._buffers
        if self._buffer_free[index] is not None:
            copy.wait_event(self._buffer_free[index])
        return self._shard_buffers[index][: shard.size], index

    def _own_part_of_slot(self, dst: torch.Tensor, previous: Any, shard: Shard, copy: Any, compute: Any,
                          sync: bool) -> torch.Tensor:
        """Where our shard is copied for an in-place gather (NCCL skips the rank's own part): its place
        in the slot. No shard buffer and no device-to-device copy, but the copy waits for compute to
        pass the slot's previous block, so the ring wants a slot more."""
        if not sync:
            copy.wait_stream(compute)
            if previous is not None:  # a gather into the slot that no block waited for
                copy.wait_event(previous)
        return dst[self.rank * shard.size : (self.rank + 1) * shard.size]

    def release(self) -> None:
        self._shard_buffers = []
        self._buffer_free = [None] * self._buffers
        self._comm_stream = None
        self.copy_stream = None
        if self.arena is not None:
            self.arena.close()
