"""A slot filler for streamed blocks on any host tier: pinned ones from the arena, the rest from their files.

The plan gives each streamed block a tier (offload/tiers.py). `pinned` blocks keep today's path: their
regions live in the pinned arena (which holds only them) and one memcpy fills a slot. `page_cache` and
`disk` blocks are never held by the process: each time the ring needs one, its tensors are read from
their safetensors files (`page_cache`: plain `preadv` through the kernel's cache; `disk`: O_DIRECT
aligned `preadv`, offload/tier_files.py) into one of `BOUNCE_SLOTS` pinned bounce slots, then copied to
the device slot at their region offsets (the layout `plan_block` gives the pinned path too, so a block
computes on the same bytes at the same place whichever tier it came from). Tensors stored in another
dtype than the block holds are converted on the host as the load would have converted them.

Reads run ahead in the ring's order on a small thread pool, several at once (each run split into
`READ_CHUNK` reads), so a block's bytes are usually in its bounce slot when the ring asks for it; a
bounce slot is read into again only after the device copy out of it has finished (its CUDA event): the
read-ahead queue is offload/tier_read_ahead.py's, the bounce ring's lifetime offload/tier_bounce.py's.
Host memory for file-tier blocks is the bounce ring alone, whatever their number, and only while it is used:
it is opened when the ring streams a file-tier block or a re-plan's blocks are read ahead (`read_next`), and
closed when neither is so (`keep_open`, two experts: opened at load, kept for the switches). Where the load
shares one ring among its readers (`LoadOptions.bounce_pool`, offload/bounce_pool.py: the DiT's and the
layer-streamed encoders'), another reader may take it between forwards (`yield_bounce`), and the next read
takes it back (`resume_bounce`, or the next `fill`). A file-tier block
read once to be resident (a `run` whose resident blocks keep no host master, a re-plan) without it goes through
a pageable buffer of its own size, freed at once (`_fill_direct`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import torch

from .block_packing import Block, plan_block, reject_shared_ranges, unique_tensors
from .bounce_pool import BouncePool
from .copy_ledger import CopyLedger
from .deferred_weights import DeferredWeights
from .devices import current_stream, placeholder, rebind, stream_context
from .file_blocks import TierReadStats, _Copy, _FileBlock, _Pending, _Stored
from .file_spans import Extent, chunks, plan_runs
from .options import DEFAULT_LOAD, LoadOptions
from .pin_fallback import NotedPiece, PinFallback, from_files, note_pieces, refused_blocks
from .pinned import HostArena, typed_view
from .slot_filler import HostCopyFiller
from .tier_bounce import READERS
from .tier_files import TierFiles
from .tier_read_ahead import TierReadAhead
from .tiers import BOUNCE_SLOTS, Tier

__all__ = ["READERS", "TierReadStats", "TieredFiller"]


class TieredFiller(TierReadAhead, HostCopyFiller):
    """Fills slots from the pinned arena or from the weight files, as each block's tier says; blocks the host
    refuses to page-lock go to the page-cache tier (`offload.pin_fallback`)."""

    partial_pins = True

    def __init__(self, device: torch.device, ledger: CopyLedger, tiers: dict[str, Tier],
                 load_options: LoadOptions = DEFAULT_LOAD, log: Callable[[str], None] = lambda _line: None,
                 keep_open: bool = False) -> None:
        super().__init__(device, ledger, load_options)
        # keep_open (two experts): the bounce ring stays once opened, ready for the next switch's reads
        self.keep_open = keep_open
        self.tiers = dict(tiers)  # block name → tier; a name not there is pinned
        self._log = log
        self._files = TierFiles(log)
        self._blocks: dict[str, _FileBlock] = {}
        self.bounce: HostArena | None = None
        self._slot_bytes = 0
        self._pool: ThreadPoolExecutor | None = None
        self._queue: deque[_Pending] = deque()
        self._slot_done: list[Any] = [None] * BOUNCE_SLOTS  # CUDA event of the last copy out of each slot
        self._order: list[str] = []
        self._then: list[str] = []  # read after the ring's last block instead of its first (`read_next`)
        self._position: dict[str, int] = {}
        self.stats = TierReadStats()
        self._stats_lock = threading.Lock()
        self._counted_until: dict[str, float] = {"page_cache": 0.0, "disk": 0.0}
        self._noted: dict[str, list[NotedPiece]] = {}
        self.pin_fallback: PinFallback | None = None  # set when page-locking stopped part way
        self._pin_bounce = True
        # the load's shared bounce arena, else a pool of its own; `_wants_bounce`: reads need a ring, held or not
        self._bounce_pool = load_options.bounce_pool or BouncePool()
        self._wants_bounce = False
        self._last = ""  # the block the ring filled last: read-ahead resumes after it

    # ------------------------------------------------------------------ packing
    def pack(self, packed: list[Block], *, pin: bool, weights: DeferredWeights | None,
             progress: Callable[[int, int], None] | None) -> None:
        files = [b for b in packed if self.tiers.get(b.name, "pinned") != "pinned"]
        if files:
            files = self._readable(files, weights)
        if files:
            assert weights is not None
            self._lay_out_files(files, weights)
        held = [b for b in packed if b.name not in self._blocks]
        in_files = sum(b.tensor_bytes for b in files)
        if held:
            def report(done: int, total: int) -> None:
                if progress is not None:
                    progress(done + in_files, total + in_files)
            super().pack(held, pin=pin, weights=weights, progress=report)
            self._fall_back(held)
        elif progress is not None:
            progress(in_files, in_files)
        self._pin_bounce = pin  # the bounce ring opens when a read needs it (`_ensure_bounce`)

    def _readable(self, files: list[Block], weights: DeferredWeights | None) -> list[Block]:
        """The file-tier blocks whose weights are still in their files; the others are pinned (and said so)."""
        ok = [b for b in files if weights is not None and any(weights.knows(t) for t in unique_tensors(b.module))]
        if len(ok) < len(files):
            for b in files:
                if b not in ok:
                    self.tiers[b.name] = "pinned"
            self._log(f"{len(files) - len(ok)} blocks planned for the page cache or disk were not loaded from "
                      "their files (read by from_pretrained): they are pinned instead")
        return ok

    def _lay_out_files(self, files: list[Block], weights: DeferredWeights) -> None:
        claims: list[tuple[Any, int, int, str]] = []
        keep_phase = self.device.type == "cpu" and weights.keep_phase
        for b in files:
            plan_block(b, claims, self.device, weights.knows, keep_phase)
        reject_shared_ranges(claims)
        for b in files:
            self._blocks[b.name] = self._file_block(b, weights)
            b.pieces = []
            b.packed = True
            for x in b.bindings:  # the empty host tensors go: the bytes are read into slots
                rebind(x.target, lambda x=x: placeholder(x.dtype, self.device))

    def _file_block(self, b: Block, weights: DeferredWeights) -> _FileBlock:
        tier = self.tiers[b.name]
        stored: list[_Stored] = []
        extras: list[tuple[int, torch.Tensor]] = []
        for p in b.pieces:
            if p.deferred:
                assert p.binding is not None
                source, via = weights.take_source(p.binding.target)
                stored.append((source, via, p.offset, p.nbytes, p.binding.dtype))
            elif p.raw:
                extras.append((p.offset, p.source.clone()))
            else:
                x = p.binding
                assert x is not None
                value = torch.empty(p.nbytes, dtype=torch.uint8)
                typed_view(value, 0, x.dtype, x.shape, x.stride).copy_(p.source.detach())
                extras.append((p.offset, value))
        return self._build(tier, stored, extras)

    def _build(self, tier: Tier, stored: list[_Stored], extras: list[tuple[int, torch.Tensor]]) -> _FileBlock:
        """A file-tier block from its tensors' file ranges (source, via, region offset, bytes, dtype)."""
        extents = [Extent(self._files.add(source.fd, direct=tier == "disk"), source.offset, source.nbytes)
                   for source, *_ in stored]
        runs, where, used = plan_runs(extents)
        copies = [_Copy(at, s.nbytes, s.dtype, via, off, dtype, n)
                  for at, (s, via, off, n, dtype) in zip(where, stored, strict=True)]
        reads = [c for r in runs for c in chunks(r)]
        return _FileBlock(tier, reads, copies, extras, used)

    # ------------------------------------------------------------------ blocks the host refused to page-lock
    def _laid_out(self, packed: list[Block], weights: DeferredWeights | None) -> None:
        self._noted = note_pieces(packed, weights)  # the reads forget where the bytes came from

    def _fall_back(self, held: list[Block]) -> None:
        """Move the held blocks the host refused to page-lock to the page-cache tier (`offload.pin_fallback`)."""
        noted, self._noted = self._noted, {}
        arena = self.arena
        unpinned = arena.unpinned_ranges if arena is not None else []
        if arena is None or not unpinned:
            return
        refused = refused_blocks(held, unpinned)
        moved = [b for b in refused if from_files(noted.get(b.name))]
        for b in moved:
            base = b.region_offset
            stored: list[_Stored] = []
            extras: list[tuple[int, torch.Tensor]] = []
            for p in noted[b.name]:
                if p.source is not None:
                    assert p.via is not None and p.dtype is not None
                    stored.append((p.source, p.via, p.offset, p.nbytes, p.dtype))
                else:  # bytes no file holds: taken from the arena before its pages go
                    extras.append((p.offset, arena.tensor[base + p.offset : base + p.offset + p.nbytes].clone()))
            self._blocks[b.name] = self._build("page_cache", stored, extras)
            self.tiers[b.name] = self._ledger.tiers[b.name] = "page_cache"
        kept = [b for b in refused if b not in moved]
        released = 0
        for lo, hi in unpinned:
            if not any(lo < b.region_offset + b.region_nbytes and b.region_offset < hi for b in kept):
                released += arena.release_range(lo, hi)
        self.pin_fallback = PinFallback(blocks=len(moved), nbytes=sum(b.tensor_bytes for b in moved),
                                        released=released, kept=len(kept), pinned_blocks=len(held) - len(refused),
                                        reason=arena.pin_failure_reason or "refused")
        self._log(self.pin_fallback.line())

    def streams_files(self, blocks: Sequence[Block]) -> bool:
        """Whether any of `blocks` (a ring's) is read from its files."""
        return any(b.name in self._blocks for b in blocks)

    # ------------------------------------------------------------------ what the streamer shows
    @property
    def file_blocks(self) -> dict[str, Tier]:
        """Each block read from its files, and its tier."""
        return {name: fb.tier for name, fb in self._blocks.items()}

    @property
    def bounce_bytes(self) -> int:
        return self.bounce.nbytes if self.bounce is not None and not self.bounce.closed else 0

    @property
    def direct_reads(self) -> bool:
        """Whether disk-tier reads bypass the page cache (O_DIRECT accepted)."""
        return self._files.direct

    def read_totals(self) -> dict[str, tuple[int, float]]:
        """Each file tier's bytes read since the load and the seconds reads were outstanding (a consistent pair)."""
        with self._stats_lock:
            return {tier: (n, self.stats.seconds.get(tier, 0.0)) for tier, n in self.stats.bytes.items()}

    # ------------------------------------------------------------------ filling a slot
    def fill(self, b: Block, out: torch.Tensor, *, sync: bool, previous: Any) -> tuple[int, Any]:
        fb = self._blocks.get(b.name)
        if fb is None:
            return super().fill(b, out, sync=sync, previous=previous)
        if self.bounce is None and self._wants_bounce:  # the shared ring was lent: take it back
            self._ensure_bounce()
        if self._pool is None or self.bounce is None:  # no bounce ring: a block read once to be resident
            return self._fill_direct(b, fb, out, sync)
        self._last = b.name
        pending = self._take(b.name)
        try:
            for f in pending.futures:
                f.result()  # a failed read raises here, in the forward that needed the block
        except BaseException:
            wait(pending.futures)
            raise
        assert self.bounce is not None
        base = pending.slot * self._slot_bytes
        src = self.bounce.tensor[base : base + self._slot_bytes]
        n = b.region_nbytes
        clock = self._clock
        if not self.cuda:
            mark = clock.start()
            self._copy(fb, src, out, non_blocking=False)
            clock.finish(mark, "copy", b.name, n, sync=sync)
            self._ledger.absorb(clock.poll())
            self._top_up(b.name)
            return n, None
        compute = current_stream(self.device)
        if sync:
            stream = compute
            if previous is not None:
                stream.wait_event(previous)
        else:
            stream = self.copy_stream
            stream.wait_stream(compute)  # the slot's previous user has finished computing
        with stream_context(stream):
            mark = clock.start(stream)
            self._copy(fb, src, out, non_blocking=self.bounce.pinned and not sync)
            end = clock.finish(mark, "copy", b.name, n, sync=sync, stream=stream)
        self._slot_done[pending.slot] = end
        self._top_up(b.name)
        return n, end

    def _fill_direct(self, b: Block, fb: _FileBlock, out: torch.Tensor, sync: bool) -> tuple[int, Any]:
        """Block `b`'s bytes read into a pageable buffer of its own and copied to `out` (synchronous)."""
        host = torch.empty(fb.slot_bytes, dtype=torch.uint8)
        view = memoryview(host.numpy()).cast("B")
        with ThreadPoolExecutor(min(READERS, max(1, len(fb.reads))), thread_name_prefix="tier-read-once") as pool:
            for done in [pool.submit(self._read, run, view, fb.tier, None) for run in fb.reads]:
                done.result()
        clock, n = self._clock, b.region_nbytes
        stream = current_stream(self.device) if self.cuda else None
        mark = clock.start(stream)
        self._copy(fb, host, out, non_blocking=False)
        clock.finish(mark, "copy", b.name, n, sync=True, stream=stream)
        if not self.cuda:
            self._ledger.absorb(clock.poll())
        return n, None

    @staticmethod
    def _copy(fb: _FileBlock, src: torch.Tensor, out: torch.Tensor, *, non_blocking: bool) -> None:
        """Each tensor from the bounce slot to its region offset in the device slot (converted if stored
        in another dtype), and the bytes no file holds."""
        for c in fb.copies:
            dst = out[c.region_offset : c.region_offset + c.nbytes]
            raw = src[c.slot_offset : c.slot_offset + c.stored_nbytes]
            if c.stored == c.dtype:
                dst.copy_(raw, non_blocking=non_blocking)
            else:  # as `PendingFill.wait` converts at the load: through the load dtype
                value = raw.clone().view(c.stored).to(c.via).to(c.dtype).view(torch.uint8)
                dst.copy_(value)
        for offset, value in fb.extras:
            out[offset : offset + value.numel()].copy_(value)

    def release(self) -> None:
        self._close_bounce()
        self._files.close()
        super().release()
