"""AllGather DLO: each rank pins 1/N of every streamed block and the ranks gather the block before it runs.

vLLM-Omni's default DLO mode, on top of `LayerwiseStreamer`'s ring (same hooks, same window, same
placement and ring depth). What changes is where a slot's bytes come from:
- the host arena holds only this rank's shard of each streamed block's packed region
  (`sharding.Shard`: ceil(region / N) bytes, zero-padded), so pinned host memory per rank is ~1/N;
- filling a slot copies that shard host→device into one of two shard buffers (copy stream), then
  `all_gather_into_tensor` rebuilds the whole region in the slot (communication stream, waiting on
  the copy); the block's pre-hook waits on the gather. PCIe carries 1/N of the bytes per rank.
- `StreamOptions.gather_in_place` instead copies the shard straight into its place in the slot and
  gathers in place (NCCL then skips the rank's own part: no shard buffer, no device-to-device copy), at
  the price of a copy that waits for compute to leave the slot. Off until two GPUs have measured it
  (`benchmarks/allgather_stream.py` compares it with the shard-buffer count and the gathers' stream
  priority, side by side).

Every rank must issue the same gathers in the same order: the ring's order follows the forward, which
is the same on every rank running the same model. Resident blocks are whole on every rank.
On a CPU (gloo) the copies and gathers are synchronous; the bytes are the same.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import torch
import torch.distributed as dist

from .arena_fill import batches, byte_progress
from .block_packing import Block, pack_block, plan_block, reject_shared_ranges
from .devices import current_stream, new_stream, stream_context
from .options import DEFAULT_STREAM, StreamOptions
from .pinned import ALIGNMENT, PAGE, HostArena, align_up
from .sharding import Shard
from .streamer import LayerwiseStreamer


def gather_into(out: torch.Tensor, shard: torch.Tensor, group: Any) -> None:
    """`all_gather_into_tensor` (newer torch names it `all_gather_single`)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, shard, group=group)


class AllGatherStreamer(LayerwiseStreamer):
    """`LayerwiseStreamer` whose streamed blocks are sharded across the ranks of `group`."""

    def __init__(self, *args: Any, group: Any = None, stream_options: StreamOptions = DEFAULT_STREAM,
                 **kwargs: Any) -> None:
        """`stream_options.shard_buffers`: device buffers the shard copies cycle through (a copy waits
        for the gather that last read its buffer). `.comm_priority`: the gathers' stream priority
        (negative: ahead of compute's kernels, so a gather is not queued behind a block's).
        `.gather_in_place`: copy the shard into the slot and gather in place instead (no shard buffers)."""
        shard_buffers = stream_options.shard_buffers
        if kwargs.get("keep_masters"):
            raise ValueError("AllGather streaming keeps only shards: it cannot keep whole masters for re-plans")
        super().__init__(*args, **kwargs)
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._shards: dict[str, tuple[Shard, int]] = {}  # block name -> (its shard, offset in the arena)
        self._shard_buffers: list[torch.Tensor] = []
        self._buffers = shard_buffers
        self._comm_priority = stream_options.comm_priority
        self._in_place = stream_options.gather_in_place
        self._buffer_free: list[Any] = [None] * shard_buffers  # the gather that last read each buffer
        self._next_buffer = 0
        self._comm_stream: Any = None
        self.gathered_bytes = 0  # bytes other ranks supplied (NVLink on GPUs) since attach

    @property
    def shard_bytes(self) -> int:
        """Bytes of this rank's shards in the arena (about streamed bytes / N)."""
        return sum(shard.size for shard, _ in self._shards.values())

    def _pack(self, packed: list[Block]) -> None:
        """Each block's region is laid out as on one GPU; only this rank's shard of it is kept. Tensors
        still in their files are read only where they overlap the shard: a rank reads ~1/N from disk."""
        claims: list[tuple[Any, int, int, str]] = []
        knows = self._weights.knows if self._weights is not None else None
        for b in packed:
            plan_block(b, claims, self.device, knows)
        reject_shared_ranges(claims)
        deferred = any(p.deferred for b in packed for p in b.pieces)
        step = PAGE if self._pin and deferred else ALIGNMENT  # pinned shard by shard: no two share a page
        cursor = 0
        for b in packed:
            shard = Shard(b.region_nbytes, self.world, self.rank)
            self._shards[b.name] = (shard, cursor)
            cursor = align_up(cursor + shard.size, step)
        self._arena = HostArena(cursor, pin=False, huge_pages=self._load_options.use_huge_pages)
        for b in packed:  # the last rank's padding is zeros, as vLLM-Omni pads (gaps between tensors are never read)
            shard, offset = self._shards[b.name]
            self._arena.tensor[offset + shard.stop - shard.start : offset + shard.size].zero_()
        reads: dict[str, list[tuple[torch.Tensor, int, torch.Tensor]]] = {}  # by block
        skipped: list[torch.Tensor] = []
        for b in packed:
            shard, offset = self._shards[b.name]
            dest = self._arena.tensor[offset : offset + shard.size]
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
            self._read_in_batches(packed, reads)
        elif self._pin:
            self._arena.pin()
        for b in packed:
            if not b.packed:
                pack_block(b, self._arena.tensor, self.device)  # all read above: re-points the tensors only
        if self._weights is not None:
            self._weights.forget(skipped)

    def _read_in_batches(self, packed: list[Block], reads: dict[str, list[tuple[torch.Tensor, int, torch.Tensor]]]
                         ) -> None:
        """The shards' reads, about 2 GB at a time on one reader pool; with pinning, each batch's shards
        are page-locked on other threads (each shard its own range) while the next batch is read, as
        `arena_fill` does on one GPU: the load costs about the longer of the two, not their sum."""
        assert self._weights is not None
        landed = byte_progress(sum(b.tensor_bytes for b in packed), self._progress, scale=self.world)
        pending: list[Future[bool]] = []
        options = self._load_options
        with ThreadPoolExecutor(options.register_threads, thread_name_prefix="arena-register") as registrar:
            try:
                with self._weights.reader_pool() as readers:
                    for batch in batches(packed, options.batch_bytes, lambda b: self._shards[b.name][0].size):
                        jobs = [job for b in batch for job in reads[b.name]]
                        if jobs:
                            self._weights.submit_parts(jobs, readers, threading.Event(), landed).wait()
                        if self._pin:
                            ranges = [(offset, offset + shard.size)
                                      for shard, offset in (self._shards[b.name] for b in batch)]
                            pending.append(registrar.submit(self._arena.pin_ranges, ranges))
            finally:
                wait(pending)  # never close an arena a registration is still working on

    def _slot_nbytes(self) -> int:
        return max((self._shards[b.name][0].gathered for b in self._streamed), default=0)

    def _fill_slot(self, b: Block, slot: int, *, sync: bool) -> int:
        """Our shard host→device, then the gather of every rank's shard into the slot; returns PCIe bytes."""
        assert self._arena is not None
        shard, offset = self._shards[b.name]
        src = self._arena.tensor[offset : offset + shard.size]
        dst = self._slots[slot][: shard.gathered]
        if not self._cuda:
            mark = self._clock.start()
            gather_into(dst, src, self.group)  # gloo: CPU tensors, synchronous
            self._clock.finish(mark, "copy", b.name, shard.size, sync=sync)
            self._absorb(self._clock.poll())
        else:
            compute = current_stream(self.device)
            if self._comm_stream is None:
                self._comm_stream = new_stream(self.device, self._comm_priority)
            copy = compute if sync else self._copy_stream
            comm = compute if sync else self._comm_stream
            if sync and self._slot_ready[slot] is not None:
                compute.wait_event(self._slot_ready[slot])
            if self._in_place:
                mine, index = self._own_part_of_slot(dst, slot, shard, copy, compute, sync), None
            else:
                mine, index = self._next_shard_buffer(shard, copy)
            with stream_context(copy):
                mark = self._clock.start(copy)
                mine.copy_(src, non_blocking=self._arena.pinned and not sync)
                copied = self._clock.finish(mark, "copy", b.name, shard.size, sync=sync, stream=copy)
            comm.wait_stream(compute)
            comm.wait_event(copied)
            with stream_context(comm):
                gather_into(dst, mine, self.group)
                done = torch.cuda.Event()
                done.record(comm)
            self._slot_ready[slot] = done
            if index is not None:
                self._buffer_free[index] = done
        self.gathered_bytes += shard.gathered - shard.size
        return shard.size

    def _next_shard_buffer(self, shard: Shard, copy: Any) -> tuple[torch.Tensor, int]:
        """Where our shard is copied by default: the next shard buffer, and its index. The copy waits
        only for that buffer's previous gather, not for compute: it runs while compute still uses the
        slot (the gather then waits for compute). The buffers rotate, made at the first copy."""
        if not self._shard_buffers:
            largest = max(part.size for part, _ in self._shards.values())
            self._shard_buffers = [torch.empty(largest, dtype=torch.uint8, device=self.device)
                                   for _ in range(self._buffers)]
        index = self._next_buffer
        self._next_buffer = (index + 1) % self._buffers
        if self._buffer_free[index] is not None:
            copy.wait_event(self._buffer_free[index])
        return self._shard_buffers[index][: shard.size], index

    def _own_part_of_slot(self, dst: torch.Tensor, slot: int, shard: Shard, copy: Any, compute: Any, sync: bool
                          ) -> torch.Tensor:
        """Where our shard is copied for an in-place gather (NCCL skips the rank's own part): its place
        in the slot. No shard buffer and no device-to-device copy, but the copy waits for compute to
        pass the slot's previous block, so the ring wants a slot more."""
        if not sync:
            copy.wait_stream(compute)
            if self._slot_ready[slot] is not None:  # a gather into the slot that no block waited for
                copy.wait_event(self._slot_ready[slot])
        return dst[self.rank * shard.size : (self.rank + 1) * shard.size]

    def _release_buffers(self) -> None:
        self._shard_buffers = []
        self._buffer_free = [None] * self._buffers
        self._comm_stream = None
        super()._release_buffers()
