"""Weights that are still in their files: read straight into their final host place, in parallel.

A component loaded this way is built with an empty host tensor for each weight (allocated, never
written, so it holds no memory until it is), and each such tensor has a `Source` (an open file, a
byte range, the stored dtype). Whoever decides where a tensor's bytes live for good asks `fill` to
read them there: the streamer into its block arena (the empty tensor is then dropped unwritten),
`materialize` into the tensor itself. No intermediate full-size copy: one `preadv` per range (large
ranges split into chunks), many ranges at once on a thread pool. The kernel copies page cache →
destination with the GIL released, so N threads read at N times one thread's rate until memory
bandwidth binds.

A range stored in another dtype than the tensor's (a float32 module kept in float32 from a bf16
file, say) is read into a scratch buffer and converted into place. A tensor `retype`d for fp8 storage
is converted as its load dtype would have been, then to fp8 (`module.to(fp8)` after the load).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import torch

CHUNK_BYTES = 32 << 20  # one read job: large enough to amortize the syscall, small enough to spread


@dataclass(frozen=True, slots=True)
class Source:
    """Where one tensor's bytes are: `nbytes` at `offset` of the open file `fd`, stored as `dtype`."""

    fd: int
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def default_threads() -> int:
    """Readers: every core, at most 32 (page-cache copies stop scaling well before that)."""
    return max(1, min(32, os.cpu_count() or 1))


class DeferredWeights:
    """The sources of every tensor still on `meta`, and the reader that fills them in place."""

    def __init__(self, threads: int | None = None, *, share_readers: bool = False, keep_phase: bool = False) -> None:
        self.threads = threads or default_threads()
        # keep_phase (a CPU device): the empty host tensors are built at their file address modulo a
        # page, so every copy that keeps a tensor's phase keeps the file's (`offload.address_phase`)
        self.keep_phase = keep_phase
        # share_readers: this object and its `sibling()`s read on one pool of `threads` threads, so
        # components loading at once never run more readers than that between them
        self._shared: ThreadPoolExecutor | None = (
            ThreadPoolExecutor(self.threads, thread_name_prefix="weights-read") if share_readers else None)
        self._owns_shared = share_readers
        self._sources: dict[int, tuple[torch.Tensor, Source]] = {}  # id(tensor) → (tensor, source), unread
        self._via: dict[int, torch.dtype] = {}  # id(tensor) → its load dtype, for a tensor retyped since
        self._fds: list[int] = []
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.seconds = 0.0  # wall time with reads outstanding (overlapping submissions counted once)
        self._counted_until = 0.0

    # ------------------------------------------------------------------ registration
    def own_fd(self, fd: int) -> None:
        """Close `fd` with this object (the sources read from it)."""
        self._fds.append(fd)

    @property
    def fds(self) -> list[int]:
        """The descriptors this object closes (`own_fd`)."""
        return list(self._fds)

    def add(self, target: torch.Tensor, source: Source) -> None:
        """`target` (an empty, contiguous host Parameter or buffer) gets its bytes from `source`."""
        if target.device.type != "cpu" or not target.is_contiguous():
            raise ValueError("a tensor waiting for its file is a contiguous host tensor")
        expected = target.numel() * source.dtype.itemsize
        if tuple(target.shape) != source.shape or expected != source.nbytes:
            raise ValueError(f"source of {tuple(source.shape)} ({source.nbytes} bytes) does not fit a tensor of "
                             f"{tuple(target.shape)}")
        self._sources[id(target)] = (target, source)

    def retype(self, target: torch.Tensor, dtype: torch.dtype) -> None:
        """`target` (waiting for its bytes) is held as `dtype` instead (fp8 storage): its empty storage is
        replaced, and the read converts through the dtype it had (as a load followed by a cast would)."""
        if not self.knows(target):
            raise ValueError("only a tensor waiting for its file can be retyped")
        if target.dtype == dtype:
            return
        self._via.setdefault(id(target), target.dtype)
        shape = tuple(target.shape)
        with torch.inference_mode(target.is_inference()):
            target.data = torch.empty(shape, dtype=dtype)

    def replace(self, old: torch.Tensor, new: torch.Tensor) -> None:
        """`new` (a tensor over `old`'s storage, taking its place in the module) waits for `old`'s bytes;
        a tensor this reader does not know is left alone."""
        if not self.knows(old):
            return
        _, source = self._sources.pop(id(old))
        self._sources[id(new)] = (new, source)
        if id(old) in self._via:
            self._via[id(new)] = self._via.pop(id(old))

    def knows(self, t: torch.Tensor) -> bool:
        """Whether `t` still waits for its bytes."""
        entry = self._sources.get(id(t))
        return entry is not None and entry[0] is t

    @property
    def pending(self) -> int:
        """Tensors still waiting for their bytes."""
        return len(self._sources)

    # ------------------------------------------------------------------ reading
    def fill(self, jobs: Sequence[tuple[torch.Tensor, torch.Tensor]],
             progress: Callable[[int], None] | None = None) -> int:
        """Read each `(target, destination)` pair's bytes into `destination` (a contiguous uint8 CPU
        tensor of the target's size in its own dtype); the targets stop waiting (their own storage stays
        unwritten unless it is the destination). Does not re-point the targets. Returns bytes.

        `progress(bytes)` is called from reader threads as chunks land; an exception it raises (a
        cancelled load) stops the remaining reads and is raised here."""
        with self.reader_pool() as pool:
            return self.submit(jobs, pool, threading.Event(), progress).wait()

    def submit(self, jobs: Sequence[tuple[torch.Tensor, torch.Tensor]], pool: ThreadPoolExecutor,
               stop: threading.Event, progress: Callable[[int], None] | None = None) -> PendingFill:
        """`fill`, queued on `pool` (see `submit_parts`)."""
        for target, dest in jobs:
            want = target.numel() * target.element_size()
            if dest.numel() != want:
                raise ValueError(f"destination holds {dest.numel()} bytes, the tensor needs {want}")
        return self.submit_parts([(target, 0, dest) for target, dest in jobs], pool, stop, progress)

    def sibling(self) -> DeferredWeights:
        """A reader for another component: its own sources and files, this one's reader threads when
        they are shared."""
        other = DeferredWeights(self.threads, keep_phase=self.keep_phase)
        other._shared = self._shared
        return other

    def reader_pool(self) -> contextlib.AbstractContextManager[ThreadPoolExecutor]:
        """A pool of `threads` readers for `submit_parts` (one pool for many submissions keeps every
        reader busy across them: no reader waits at the end of one submission for the slowest read):
        the shared one, left running on exit, or a new one, joined on exit. Either way, wait for (or
        `settle`) every submission before its destinations go."""
        if self._shared is not None:
            return contextlib.nullcontext(self._shared)
        return ThreadPoolExecutor(self.threads, thread_name_prefix="weights-read")

    def submit_parts(self, jobs: Sequence[tuple[torch.Tensor, int, torch.Tensor]], pool: ThreadPoolExecutor,
                     stop: threading.Event, progress: Callable[[int], None] | None = None) -> PendingFill:
        """Queue reads of parts on `pool` and return at once; `wait()` on the result finishes them.
        `(target, start, destination)` reads the target's bytes (in its own dtype) from byte `start` on,
        as many as `destination` holds (an AllGather rank reads only its shard of each block); every
        target named stops waiting.
        A failed read (or a `progress` that raises) sets `stop`, and every read sharing `stop` is skipped."""
        reads: list[tuple[int, int, memoryview]] = []
        converts: list[tuple[Source, torch.Tensor, int, torch.Tensor, torch.dtype, torch.dtype]] = []
        for target, start, dest in jobs:
            _, source = self._sources[id(target)]
            if dest.dtype != torch.uint8 or dest.device.type != "cpu" or not dest.is_contiguous():
                raise ValueError("a destination is a contiguous uint8 CPU tensor")
            if start < 0 or start + dest.numel() > math.prod(source.shape) * target.element_size():
                raise ValueError(f"bytes {start}..{start + dest.numel()} are outside the tensor")
            if source.dtype == target.dtype:
                reads.extend(_chunks(source.fd, source.offset + start, _as_view(dest)))
            else:
                scratch = torch.empty(source.nbytes, dtype=torch.uint8)
                reads.extend(_chunks(source.fd, source.offset, _as_view(scratch)))
                via = self._via.get(id(target), target.dtype)
                converts.append((source, scratch, start, dest, target.dtype, via))

        def read(job: tuple[int, int, memoryview]) -> None:
            if stop.is_set():
                raise ReadsStopped("skipped: an earlier read failed or the load was cancelled")
            fd, offset, view = job
            try:
                _read_exactly(fd, offset, view)
                if progress is not None:
                    progress(len(view))
            except BaseException:
                stop.set()
                raise

        futures = [pool.submit(read, job) for job in reads]
        return PendingFill(self, [target for target, _, _ in jobs], futures, converts,
                           sum(len(view) for _, _, view in reads))

    def _filled(self, targets: list[torch.Tensor], nbytes: int, since: float) -> None:
        """A submission's reads have all landed: count them, and its targets stop waiting."""
        with self._lock:
            end = time.perf_counter()
            self.bytes_read += nbytes
            self.seconds += max(0.0, end - max(since, self._counted_until))
            self._counted_until = end
        for target in targets:
            self._sources.pop(id(target), None)
            self._via.pop(id(target), None)

    def source_of(self, t: torch.Tensor) -> tuple[Source, torch.dtype]:
        """Where `t`'s bytes are and the dtype its read converts through, `t` still waiting (a block the host
        could not page-lock after its read is read from its files again: `offload.pin_fallback`)."""
        if not self.knows(t):
            raise ValueError("only a tensor waiting for its file has a source")
        return self._sources[id(t)][1], self._via.get(id(t), t.dtype)

    def take_source(self, t: torch.Tensor) -> tuple[Source, torch.dtype]:
        """Where `t`'s bytes are and the dtype its read converts through; `t` stops waiting (a file-tier
        block reads its tensors from their files at each use: `offload.tier_filler`)."""
        if not self.knows(t):
            raise ValueError("only a tensor waiting for its file has a source")
        _, source = self._sources.pop(id(t))
        return source, self._via.pop(id(t), t.dtype)

    def forget(self, tensors: Iterable[torch.Tensor]) -> None:
        """These tensors no longer wait (their bytes are not needed here: another rank holds them)."""
        for t in tensors:
            if self.knows(t):
                self._sources.pop(id(t), None)

    def materialize(self, tensors: Iterable[torch.Tensor], progress: Callable[[int], None] | None = None) -> int:
        """Read every waiting tensor among `tensors` into its own storage."""
        pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for t in tensors:
            if id(t) not in pending and self.knows(t):
                pending[id(t)] = (t, _own_bytes(t))
        return self.fill(list(pending.values()), progress)

    def materialize_module(self, module: torch.nn.Module, progress: Callable[[int], None] | None = None) -> int:
        return self.materialize([*module.parameters(), *module.buffers()], progress)

    def close(self) -> None:
        """Close the files (idempotent); tensors still on `meta` can no longer be filled. The object
        that made a shared reader pool joins it."""
        if self._owns_shared and self._shared is not None:
            self._shared.shutdown(wait=True)
        self._shared = None
        fds, self._fds = self._fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._sources.clear()
        self._via.clear()


class ReadsStopped(RuntimeError):
    """A queued read that never ran because another one sharing its stop flag failed first."""


class PendingFill:
    """Reads queued by `DeferredWeights.submit_parts`; `wait()` once, in submission order."""

    def __init__(self, weights: DeferredWeights, targets: list[torch.Tensor], futures: list[Future[None]],
                 converts: list[tuple[Source, torch.Tensor, int, torch.Tensor, torch.dtype, torch.dtype]],
                 nbytes: int) -> None:
        self._weights, self._targets, self._futures, self._converts = weights, targets, futures, converts
        self.nbytes = nbytes
        self._start = time.perf_counter()

    def settle(self) -> None:
        """Block until no read of this submission is running or queued (after a failure elsewhere: its
        destinations may then be freed), raising nothing."""
        wait(self._futures)

    def wait(self) -> int:
        """Block until every read has landed (raising the first failure), convert what needs it, and mark
        the targets filled; returns the bytes read."""
        errors = [f.exception() for f in self._futures]
        # the cause, not the skips it led to
        first = next((e for e in errors if e is not None and not isinstance(e, ReadsStopped)),
                     next((e for e in errors if e is not None), None))
        if first is not None:
            raise first
        self._weights._filled(self._targets, self.nbytes, self._start)
        for source, scratch, start, dest, dtype, via in self._converts:  # after every read: a conversion needs all
            converted = scratch.view(source.dtype).to(via).to(dtype).view(torch.uint8)
            dest.copy_(converted[start : start + dest.numel()])
        return self.nbytes


def _own_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's own bytes as a flat uint8 tensor (it is contiguous: `add` checked)."""
    return t.detach().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def _as_view(dest: torch.Tensor) -> memoryview:
    return memoryview(dest.numpy()).cast("B")


def _chunks(fd: int, offset: int, view: memoryview) -> list[tuple[int, int, memoryview]]:
    return [(fd, offset + at, view[at : at + CHUNK_BYTES]) for at in range(0, len(view), CHUNK_BYTES)]


def _read_exactly(fd: int, offset: int, view: memoryview) -> None:
    """`preadv` until the view is full; a file shorter than its header promised is an error."""
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise OSError(f"file ended {len(view) - done} bytes early (truncated while loading?)")
        done += got
