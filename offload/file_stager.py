"""A staged encoder/VAE whose master is its weight files: the page-cache and disk tiers of a staged component.

`ModuleStager` keeps a host master of every weight (offload/stager.py). When the plan puts a component in the
`page_cache` or `disk` tier (offload/tiers.py) the process keeps none: at each load (its stage) the stager reads
every tensor from its safetensors file (`page_cache`: buffered `preadv`; `disk`: O_DIRECT, with the fallback of
offload/tier_files.py) in chunks (`stage_chunk_bytes`: a sixteenth of the component, at most `COLD_CHUNK`) into a
ring of `BOUNCE_SLOTS` bounce slots (page-locked on CUDA), and copies each chunk to its place in the device copy,
converting a tensor stored in another dtype as the load did. Several reads are in flight while a chunk is copied;
a slot is read into again only after the copy out of it has finished. The ring exists only during the load:
between stages the component costs the host nothing but the bytes no file holds as they are (buffers built at
construction, a non-contiguous view), kept as small host copies. The device copy is dropped after the stage as
today.

Which tensors come from which file range is given by a `DeferredWeights` whose sources were checked against
the loaded bytes (engine/loading/file_sources.py), so a component reads exactly the bytes it computed with.
A file changed after the load fails the stage with one line (`tier_files.FileChanged`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import torch

from .address_phase import place_like
from .deferred_weights import DeferredWeights
from .devices import current_stream, placeholder, rebind, stream_context, synchronize
from .events import StagingEvent
from .file_spans import Run
from .pinned import HostArena
from .stager import ModuleStager, _Group, _view_of
from .tier_files import TierFiles
from .tiers import BOUNCE_SLOTS, COLD_CHUNK, PAGE, Tier, bounce_ring_bytes, bounce_slot_bytes, stage_chunk_bytes


@dataclass(frozen=True, slots=True)
class _Piece:
    """One chunk of a tensor: `run` brings its stored bytes to `lead` of a bounce slot; they go to byte `dst` of
    the group's device copy as `dtype` (`dst_nbytes` there), converted through `via` when stored otherwise."""

    group: int
    run: Run
    lead: int
    stored_nbytes: int
    stored: torch.dtype
    via: torch.dtype
    dtype: torch.dtype
    dst: int
    dst_nbytes: int


@dataclass(slots=True)
class _Reads:
    pieces: list[_Piece] = field(default_factory=list)
    extras: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (target index, its host bytes)


def _down(n: int) -> int:
    return n // PAGE * PAGE


def _up(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


def pieces_of(group: int, key: int, offset: int, nbytes: int, stored: torch.dtype, via: torch.dtype,
              dtype: torch.dtype, dst: int, chunk: int = COLD_CHUNK) -> list[_Piece]:
    """A tensor stored at `offset` (`nbytes`, as `stored`) in file `key` as reads of at most `chunk` bytes
    (whole elements), each widened to whole pages, and where each lands in the device copy (byte `dst` on)."""
    out: list[_Piece] = []
    per = max(1, chunk // stored.itemsize) * stored.itemsize
    scale = dtype.itemsize / stored.itemsize
    for at in range(0, nbytes, per):
        n = min(per, nbytes - at)
        start = _down(offset + at)
        end = offset + at + n
        run = Run(key, start, _up(end) - start, 0, end - start)
        out.append(_Piece(group, run, offset + at - start, n, stored, via, dtype, dst + int(at * scale),
                          int(n * scale)))
    return out


class FileStager(ModuleStager):
    """Stages a module from its weight files (see the module docstring): no host master."""

    def __init__(self, name: str, module: torch.nn.Module, device: torch.device | str, *, tier: Tier,
                 weights: DeferredWeights, log: Callable[[str], None] = lambda _line: None,
                 exclude: Sequence[torch.nn.Module] = (), **kwargs: Any) -> None:
        if tier == "pinned":
            raise ValueError("a pinned component keeps a host master: use ModuleStager")
        self.tier: Tier = tier
        self._weights = weights
        self._files = TierFiles(log)
        self._reads: list[_Reads] = []
        self._pin_ring = bool(kwargs.get("pin", True))
        self.read_seconds = 0.0  # the last load's wall time, reads and copies
        super().__init__(name, module, device, exclude=exclude, **kwargs)

    # ------------------------------------------------------------------ what it holds
    @property
    def held_host_bytes(self) -> int:
        """Host bytes kept between stages: the bytes no file holds as they are."""
        return sum(v.numel() for r in self._reads for _, v in r.extras)

    @property
    def file_bytes(self) -> int:
        """Stored bytes one load reads from the files."""
        return sum(p.stored_nbytes for r in self._reads for p in r.pieces)

    @property
    def ring_bytes(self) -> int:
        """Host bytes of the bounce ring a load reads through (only during the load)."""
        largest = max((p.run.length for r in self._reads for p in r.pieces), default=0)
        return bounce_ring_bytes(largest - 2 * PAGE) if largest else 0

    @property
    def direct_reads(self) -> bool:
        return self._files.direct

    # ------------------------------------------------------------------ snapshot: reads instead of masters
    def _masters(self, groups: list[_Group], sources: list[torch.Tensor], in_place: list[bool], pin: bool) -> None:
        chunk = stage_chunk_bytes(sum(g.nbytes for g in groups))
        for gi, g in enumerate(groups):
            reads = _Reads()
            for ti, t in enumerate(g.targets):
                x = t.tensor
                if self._weights.knows(x) and x.is_contiguous():
                    source, via = self._weights.take_source(x)
                    key = self._files.add(source.fd, direct=self.tier == "disk")
                    dst = t.storage_offset * t.dtype.itemsize
                    reads.pieces.extend(pieces_of(gi, key, source.offset, source.nbytes, source.dtype, via, t.dtype,
                                                  dst, chunk))
                else:  # not in a file as it is: a small host copy
                    reads.extras.append((ti, x.detach().clone()))
            self._reads.append(reads)
            g.master = None

    def _point_to_master(self, g: _Group) -> None:
        for t in g.targets:  # the bytes are read from the files at the next load
            rebind(t.tensor, lambda t=t: placeholder(t.dtype, torch.device("cpu")))

    # ------------------------------------------------------------------ load: read, copy, point
    def _load_once(self) -> None:
        storages = [place_like(self.allocate, g.nbytes, self.device, g.phase) for g in self._groups]
        self._device_storages = storages
        start = time.perf_counter()
        self._fill(storages)
        for g, dev in zip(self._groups, storages, strict=True):
            self._point_to(g, dev)
        self.loaded = True
        self.read_seconds = time.perf_counter() - start
        self._bus.publish(StagingEvent(target=self.name, direction="h2d", nbytes=self.staged_bytes,
                                       seconds=self.read_seconds, tier=self.tier))

    def _fill(self, storages: list[torch.Tensor]) -> None:
        pieces = [p for r in self._reads for p in r.pieces]
        if pieces:
            slot = bounce_slot_bytes(max(p.run.length for p in pieces) - 2 * PAGE)
            ring = HostArena(BOUNCE_SLOTS * slot, pin=False)
            try:
                if self._cuda and self._pin_ring:
                    ring.pin()  # a failure leaves it pageable: synchronous copies
                self._through(ring, slot, pieces, storages)
            finally:
                ring.close()
        for g, r, dev in zip(self._groups, self._reads, storages, strict=True):
            for ti, value in r.extras:
                _view_of(dev, g.targets[ti]).copy_(value)

    def _through(self, ring: HostArena, slot: int, pieces: list[_Piece], storages: list[torch.Tensor]) -> None:
        """Read `pieces` into the ring's slots, several ahead, and copy each to its device storage."""
        views = [memoryview(ring.tensor.numpy()).cast("B")[s * slot : (s + 1) * slot] for s in range(BOUNCE_SLOTS)]
        done: list[Any] = [None] * BOUNCE_SLOTS  # the copy out of each slot (CUDA event)
        futures: dict[int, Future[int]] = {}
        stream = self._copy_stream if self._cuda else None
        with ThreadPoolExecutor(BOUNCE_SLOTS, thread_name_prefix="stage-read") as pool:
            def submit(i: int) -> None:
                s = i % BOUNCE_SLOTS
                futures[i] = pool.submit(self._read, pieces[i].run, views[s], done[s])

            try:
                for i in range(min(BOUNCE_SLOTS, len(pieces))):
                    submit(i)
                if stream is not None:
                    stream.wait_stream(current_stream(self.device))  # the storages were allocated there
                for i, p in enumerate(pieces):
                    futures.pop(i).result()
                    s = i % BOUNCE_SLOTS
                    src = ring.tensor[s * slot + p.lead : s * slot + p.lead + p.stored_nbytes]
                    dst = storages[p.group][p.dst : p.dst + p.dst_nbytes]
                    done[s] = self._copy(src, dst, p, stream, ring.pinned)
                    if i + BOUNCE_SLOTS < len(pieces):
                        submit(i + BOUNCE_SLOTS)
                if stream is not None:
                    current_stream(self.device).wait_stream(stream)
            finally:
                wait(list(futures.values()))
                if self._cuda:
                    synchronize(self.device)  # no copy may still read the ring it is about to free

    def _read(self, run: Run, view: memoryview, after: Any) -> int:
        if after is not None:
            after.synchronize()
        return self._files.read(run, view, self.tier)

    @staticmethod
    def _copy(src: torch.Tensor, dst: torch.Tensor, p: _Piece, stream: Any, pinned: bool) -> Any:
        """One chunk to the device (converted as the load converted it); returns the copy's CUDA event."""
        if stream is None:
            _convert_into(src, dst, p, non_blocking=False)
            return None
        with stream_context(stream):
            _convert_into(src, dst, p, non_blocking=pinned)
            event = torch.cuda.Event()
            event.record(stream)
        return event

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._files.close()
            self._reads = []


def _convert_into(src: torch.Tensor, dst: torch.Tensor, p: _Piece, *, non_blocking: bool) -> None:
    if p.stored == p.dtype:
        dst.copy_(src, non_blocking=non_blocking)
    else:  # as `PendingFill.wait` converts at the load: through the load dtype
        dst.copy_(src.clone().view(p.stored).to(p.via).to(p.dtype).view(torch.uint8))
