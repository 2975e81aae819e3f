"""Lay the packed blocks out in one host arena, fill it, and page-lock it.

Blocks whose tensors are host tensors are copied in (`pack_block`). Blocks whose tensors are still
in their files (`offload.deferred_weights`) are read straight into their regions, in parallel, on
one pool of readers kept busy from the first byte to the last. As each batch of blocks lands it is
page-locked on other threads while the next ones are read, each block its own `cudaHostRegister`
range (regions then start on page boundaries, and a block copy never leaves its range). Registering
already-written memory only pins its pages, so the two overlap: the load costs about the longer of
reading and registering, not their sum.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import torch

from .block_packing import Block, deferred_pieces, pack_block, plan_block, reject_shared_ranges
from .deferred_weights import DeferredWeights, PendingFill
from .options import DEFAULT_LOAD, LoadOptions
from .pinned import ALIGNMENT, PAGE, HostArena, align_up


def lay_out(packed: list[Block], device: torch.device, *, pin: bool, weights: DeferredWeights | None,
            options: LoadOptions = DEFAULT_LOAD, partial: bool = False) -> HostArena:
    """Plan every block's region (`Block.region_offset`) and allocate the arena that holds them all
    (on huge pages unless `options.use_huge_pages` is off; `partial`: blocks that page-locked stay
    locked when later ones cannot be, see `HostArena`)."""
    claims: list[tuple[Any, int, int, str]] = []
    knows = weights.knows if weights is not None else None
    # CPU only: tensors read from their files keep the file's address phase (`offload.address_phase`)
    keep_phase = device.type == "cpu" and weights is not None and weights.keep_phase
    for b in packed:
        plan_block(b, claims, device, knows, keep_phase)
    reject_shared_ranges(claims)
    # pinned block by block: each region starts on a page, so no two blocks' registrations share one
    # (starting them on 2 MiB huge pages changed no measured load time)
    # keeping the file's phase, read-in regions start on a page too (`plan_block`)
    step = PAGE if _deferred(packed) and (pin or keep_phase) else ALIGNMENT
    cursor = 0
    for b in packed:
        b.region_offset = cursor
        cursor = align_up(cursor + b.region_nbytes, step)
    # pinned once filled: see HostArena.pin
    return HostArena(cursor, pin=False, huge_pages=options.use_huge_pages, locker=options.page_locker,
                     partial=partial)


def fill(packed: list[Block], arena: HostArena, device: torch.device, *, pin: bool,
         weights: DeferredWeights | None, progress: Callable[[int, int], None] | None,
         options: LoadOptions = DEFAULT_LOAD) -> None:
    """Copy or read every block into its region and (with `pin`) page-lock the arena; reads are batched,
    queued ahead and page-locked as `options` says."""
    if _deferred(packed):
        assert weights is not None
        _read_in_batches(packed, arena, device, weights, pin, progress, options)
    else:
        _copy_in(packed, arena, device, progress)
        if pin:
            arena.pin()


def _deferred(packed: list[Block]) -> bool:
    return any(p.deferred for b in packed for p in b.pieces)


def _copy_in(packed: list[Block], arena: HostArena, device: torch.device,
             progress: Callable[[int, int], None] | None) -> None:
    total = sum(b.tensor_bytes for b in packed)
    done = 0
    for b in packed:
        pack_block(b, arena.tensor, device)
        done += b.tensor_bytes
        if progress is not None:
            progress(done, total)


def _read_in_batches(packed: list[Block], arena: HostArena, device: torch.device, weights: DeferredWeights,
                     pin: bool, progress: Callable[[int, int], None] | None, options: LoadOptions) -> None:
    """Batches' reads are queued `options.read_ahead_batches` ahead on one reader pool (no reader idles at a
    batch's end, which a cold disk feels most); batches are finished in order, each registered as it
    completes."""
    landed = byte_progress(sum(b.tensor_bytes for b in packed), progress)
    stop = threading.Event()
    pending: list[Future[bool]] = []
    runs = batches(packed, options.batch_bytes)
    ahead = len(runs) if options.read_ahead_batches is None else options.read_ahead_batches
    with ThreadPoolExecutor(options.register_threads, thread_name_prefix="arena-register") as registrar:
        try:
            queued: deque[tuple[list[Block], PendingFill]] = deque()
            with weights.reader_pool() as readers:
                try:
                    for at in range(len(runs)):
                        while len(queued) <= ahead and at + len(queued) < len(runs):
                            batch = runs[at + len(queued)]
                            jobs = [job for b in batch for job in deferred_pieces(b, arena.tensor)]
                            queued.append((batch, weights.submit(jobs, readers, stop, landed)))
                        batch, reads = queued.popleft()
                        reads.wait()
                        for b in batch:
                            copied = sum(p.nbytes for p in b.pieces if not p.deferred)
                            pack_block(b, arena.tensor, device)
                            if copied:
                                landed(copied)
                        if pin:
                            ranges = [(b.region_offset, b.region_offset + b.region_nbytes) for b in batch]
                            pending.append(registrar.submit(arena.pin_ranges, ranges))
                except BaseException:
                    stop.set()  # the queued reads are skipped; those under way finish before the arena can go
                    for _, reads in queued:
                        reads.settle()
                    raise
        finally:
            wait(pending)  # never close an arena a registration is still working on


def byte_progress(total: int, progress: Callable[[int, int], None] | None, scale: int = 1) -> Callable[[int], None]:
    """A thread-safe `landed(nbytes)` for reader threads that reports `progress(done × scale, total)`
    (`scale`: an AllGather rank reads 1/N of what the ranks load together)."""
    done = 0
    lock = threading.Lock()

    def landed(nbytes: int) -> None:
        nonlocal done
        with lock:
            done += nbytes
            at = min(done * scale, total)
        if progress is not None:
            progress(at, total)

    return landed


def batches(packed: list[Block], batch_bytes: int,
            nbytes: Callable[[Block], int] = lambda b: b.region_nbytes) -> list[list[Block]]:
    """The blocks in runs of about `batch_bytes` of what each one puts in its arena (`nbytes`: its
    region; an AllGather rank's shard of it)."""
    out: list[list[Block]] = [[]]
    size = 0
    for b in packed:
        if size >= batch_bytes:
            out.append([])
            size = 0
        out[-1].append(b)
        size += nbytes(b)
    return out
