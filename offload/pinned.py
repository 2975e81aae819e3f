"""Exact-size host arenas, and the layout helpers the streamer and stager use to fill them.

PyTorch's pinned allocator (`pin_memory()`, `torch.empty(pin_memory=True)`) rounds every block up
to a power of two, so a 2.25 GiB block costs 4 GiB of page-locked RAM. An arena here is one
ordinary (pageable) allocation of exactly the requested size that is then page-locked in place
with `cudaHostRegister`, so host use equals the bytes we asked for.

Arenas of at least a huge page are mapped on their own and advised to use transparent huge pages
(`MADV_HUGEPAGE`), where the kernel offers them: filling a 2 MiB page is one fault instead of 512,
and page-locking it was steadier on an H200 host (0.7-1.1 s for 34-42 GB against 1.0-2.6 s on 4 KiB
pages). Only while the host has that much memory free, though: with `defrag` at its default
(`madvise`), a fault in an advised mapping that finds no free huge page reclaims and compacts memory
on the spot, which would stall
a load on a host whose RAM is full of page cache (the checkpoint's own files, typically). Where the
kernel refuses or memory is short, the mapping stays on ordinary 4 KiB pages; nothing else changes.

The layout helpers (`align_up`, `typed_view`, ...) place tensors at 256-byte aligned offsets, so a
whole DiT block (or a whole component) is one contiguous region that one memcpy can move.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import threading
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from .page_release import dontneed
from .units import ALIGNMENT, align_up  # noqa: F401  (re-exported: the packers import them from here)

PAGE = 4096
HUGE_PAGE = 2 << 20
SPARE = 1 << 30  # free memory left over before an arena is advised to use huge pages

_held_lock = threading.Lock()
_held_bytes = 0


def pinned_bytes_held() -> int:
    """Bytes currently page-locked by live arenas in this process (telemetry reads this)."""
    with _held_lock:
        return _held_bytes


_arena_bytes = 0


def arena_bytes_held() -> int:
    """Bytes of the host arenas open in this process, page-locked or not (tests hold a load to its plan)."""
    with _held_lock:
        return _arena_bytes


def _add_arena(delta: int) -> None:
    global _arena_bytes
    with _held_lock:
        _arena_bytes += delta


_register_seconds = 0.0


def register_seconds_total() -> float:
    """Seconds this process has spent in `cudaHostRegister` (the load reports its share)."""
    with _held_lock:
        return _register_seconds


def _add_register_seconds(seconds: float) -> None:
    global _register_seconds
    with _held_lock:
        _register_seconds += seconds


def _add_held(delta: int) -> None:
    global _held_bytes
    with _held_lock:
        _held_bytes += delta


def _cuda_error_name(code: object) -> str:
    return getattr(code, "name", None) or str(code)


class PageLocker(Protocol):
    """What page-locks a host range in place: CUDA's `cudaHostRegister` (`CUDA_LOCKER`); a test passes a
    double that fails where it says, to exercise what a load does when page-locking stops part way."""

    def register(self, ptr: int, nbytes: int) -> str | None:
        """Page-lock `nbytes` at `ptr`; None when locked, else why not (one line)."""

    def unregister(self, ptr: int) -> None:
        """Undo a registration that succeeded."""


class CudaPageLocker:
    """`cudaHostRegister` / `cudaHostUnregister` (0: cudaHostRegisterDefault)."""

    def register(self, ptr: int, nbytes: int) -> str | None:
        if not torch.cuda.is_available():
            return "CUDA is not available"
        try:
            rc = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)
        except Exception as exc:  # driver/runtime trouble: stay pageable, say why
            return f"cudaHostRegister raised {type(exc).__name__}: {exc}"
        return None if int(rc) == 0 else f"cudaHostRegister failed: {_cuda_error_name(rc)}"  # 0: cudaSuccess

    def unregister(self, ptr: int) -> None:
        torch.cuda.cudart().cudaHostUnregister(ptr)


CUDA_LOCKER = CudaPageLocker()


class HostArena:
    """One uint8 CPU tensor of exactly `nbytes`, page-locked in place when asked and possible.

    Pinning failure is not an error: the arena stays pageable (copies from it are then synchronous
    and slower) and `pin_failure_reason` says why, so an operator can see it. With `partial`, a range
    that fails does not undo the others: the ranges that locked stay locked, those that did not are
    listed (`unpinned_ranges`) so that their owner can read their bytes from elsewhere and give the
    memory back (`release_range`) instead of holding it pageable, where the kernel would swap it.
    """

    def __init__(self, nbytes: int, *, pin: bool, huge_pages: bool = True, locker: PageLocker | None = None,
                 partial: bool = False) -> None:
        """`huge_pages=False`: never advised to use huge pages (`offload.options.LoadOptions.use_huge_pages`);
        `locker`: what page-locks (default `CUDA_LOCKER`)."""
        if nbytes < 0:
            raise ValueError(f"arena size must be >= 0, got {nbytes}")
        self._nbytes = int(nbytes)
        buffer, self.huge_pages = _page_aligned_buffer(self._nbytes, huge_pages)
        self._tensor: torch.Tensor | None = torch.from_numpy(buffer)
        _add_arena(self._nbytes)
        self._locker = locker or CUDA_LOCKER
        self._partial = partial
        self._registered: list[tuple[int, int]] = []  # (pointer, bytes) of each registration
        self._unpinned: list[tuple[int, int]] = []  # partial: [lo, hi) ranges that could not be locked
        self._released = 0  # bytes given back to the kernel (`release_range`)
        self._pin_failure_reason: str | None = None
        self._registry_lock = threading.Lock()  # loaders register ranges from several threads at once
        if pin:
            self.pin()

    def pin(self) -> bool:
        """Page-lock the buffer now (idempotent); False, with `pin_failure_reason`, if it cannot be.

        Callers that fill a large arena from other host tensors pin it *after* filling: registering
        faults in every page at once, so pinning first would hold the arena and all the source
        tensors in RAM together, where filling first frees each source as it is copied.
        """
        if not self._registered and not self._unpinned and self._tensor is not None:
            return self.pin_ranges([(0, self._nbytes)])
        return self.pinned

    def pin_ranges(self, ranges: Sequence[tuple[int, int]]) -> bool:
        """Page-lock `[lo, hi)` byte ranges, each its own registration (a loader pins each block as soon
        as it has been read, overlapping registration with the reads of the next ones).

        Ranges must not share a page (start them on page boundaries). A copy must stay inside one
        range to run asynchronously. On any failure every registration is undone, the arena stays
        pageable and `pin_failure_reason` says why; returns `pinned`. With `partial`, the failed range
        and every later one are listed in `unpinned_ranges` (no further registration is tried: a
        driver out of lockable memory would refuse each one, slowly) and the locked ones stay."""
        if self._tensor is None or (self._pin_failure_reason is not None and not self._partial):
            return False
        for lo, hi in ranges:
            reason = self._pin_failure_reason or self._register(self._tensor.data_ptr() + lo, hi - lo)
            if reason is None:
                continue
            with self._registry_lock:
                self._pin_failure_reason = self._pin_failure_reason or reason
                if self._partial:
                    self._unpinned.append((lo, hi))
            if not self._partial:
                self._unregister_all()
                return False
        return self.pinned

    def _register(self, ptr: int, nbytes: int) -> str | None:
        if nbytes <= 0:
            return "empty arena" if self._nbytes == 0 else None
        start = time.perf_counter()
        try:
            reason = self._locker.register(ptr, nbytes)
        finally:
            _add_register_seconds(time.perf_counter() - start)
        if reason is not None:
            return reason
        with self._registry_lock:
            # another thread's range failed meanwhile: without `partial` this one is undone too
            undo = self._pin_failure_reason is not None and not self._partial
            if not undo:
                self._registered.append((ptr, nbytes))
                _add_held(nbytes)
        if undo:
            self._locker.unregister(ptr)
        return None

    def _unregister_all(self) -> None:
        with self._registry_lock:
            registered, self._registered = self._registered, []
        for ptr, nbytes in registered:
            try:
                self._locker.unregister(ptr)
            finally:
                _add_held(-nbytes)

    @property
    def unpinned_ranges(self) -> list[tuple[int, int]]:
        """`partial`: the ranges asked for that could not be page-locked and still hold their bytes."""
        with self._registry_lock:
            return sorted(self._unpinned)

    def release_range(self, lo: int, hi: int) -> int:
        """Give an unpinned range's pages back to the kernel (its owner reads those bytes from elsewhere
        now; reading them here again gives zeros). Returns the bytes given back: the whole pages inside
        `[lo, hi)`, or 0 where the kernel refused."""
        with self._registry_lock:
            if (lo, hi) not in self._unpinned or self._tensor is None:
                raise ValueError(f"[{lo}, {hi}) is not an unpinned range of this arena")
            self._unpinned.remove((lo, hi))
            base = self._tensor.data_ptr()
        start = -(base + lo) % PAGE + lo
        end = hi - (base + hi) % PAGE if hi < self._nbytes else hi
        if end - start < PAGE:
            return 0
        nbytes = (end - start) // PAGE * PAGE
        if not dontneed(base + start, nbytes):
            return 0
        with self._registry_lock:
            self._released += nbytes
        _add_arena(-nbytes)
        return nbytes

    @property
    def held_bytes(self) -> int:
        """Bytes the arena still holds: its size less what `release_range` gave back."""
        return 0 if self._tensor is None else self._nbytes - self._released

    @property
    def tensor(self) -> torch.Tensor:
        if self._tensor is None:
            raise RuntimeError("arena is closed")
        return self._tensor

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def pinned(self) -> bool:
        """Page-locked (the whole arena, or every range a loader asked for, without a failure; with
        `partial`, every range that still holds bytes)."""
        if self._partial:
            return bool(self._registered) and not self._unpinned
        return bool(self._registered) and self._pin_failure_reason is None

    @property
    def pinned_bytes(self) -> int:
        return sum(n for _, n in self._registered)

    @property
    def closed(self) -> bool:
        return self._tensor is None

    @property
    def pin_failure_reason(self) -> str | None:
        return self._pin_failure_reason

    def close(self) -> None:
        """Unregister and drop the buffer. Idempotent.

        The caller must make sure no asynchronous copy still reads the arena (synchronize first).
        Views that outlive the arena keep the memory alive, but it is no longer page-locked.
        """
        self._unregister_all()
        if self._tensor is not None:
            _add_arena(-(self._nbytes - self._released))
        self._tensor = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("pinned" if self.pinned else "pageable")
        return f"HostArena({self._nbytes} bytes, {state})"


def _free_bytes() -> int:
    """Memory the kernel has free now (not counting page cache it would have to reclaim first)."""
    import psutil

    return int(psutil.virtual_memory().free)


def _page_aligned_buffer(nbytes: int, huge_pages: bool = True) -> tuple[np.ndarray, bool]:
    """`nbytes` of uninitialised host memory starting on a page (ranges then pin apart, and
    `is_pinned()` of a tensor over the arena sees the registered pointer), and whether it was advised
    to use huge pages: a large one (with `huge_pages`) is its own anonymous mapping, aligned to a huge page."""
    if huge_pages and nbytes >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE") and _free_bytes() > nbytes + SPARE:
        mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        whole = np.frombuffer(mapping, dtype=np.uint8)  # keeps the mapping alive as long as any view
        start = -whole.ctypes.data % HUGE_PAGE
        try:
            mapping.madvise(mmap.MADV_HUGEPAGE, start, nbytes - nbytes % PAGE)
            advised = True
        except OSError:  # a kernel without transparent huge pages: ordinary pages
            advised = False
        return whole[start : start + nbytes], advised
    raw = np.empty(nbytes + PAGE, dtype=np.uint8)  # numpy owns the few bytes before the page
    start = -raw.ctypes.data % PAGE
    return raw[start : start + nbytes], False


# ---------------------------------------------------------------------------------------------
# Layout: where each tensor lives inside one flat byte buffer.


def contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    stride: list[int] = []
    acc = 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= max(int(size), 1)
    return tuple(reversed(stride))


def span_elements(shape: Sequence[int], stride: Sequence[int]) -> int:
    """Elements between the first and one past the last addressed element (the physical span)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((size - 1) * st for size, st in zip(shape, stride, strict=True))


def is_dense(t: torch.Tensor) -> bool:
    """True when `t` covers its span exactly once (contiguous in some dimension order).

    Such tensors (contiguous, transposed, permuted) are packed in their physical order with their
    own strides, so kernels see exactly the layout they saw before streaming.
    """
    if t.numel() == 0:
        return True
    dims = sorted(((st, size) for size, st in zip(t.shape, t.stride(), strict=True) if size != 1))
    expected = 1
    for st, size in dims:
        if st != expected:
            return False
        expected *= size
    return True


def arena_views(specs: Sequence[tuple[Sequence[int], torch.dtype]], phases: Sequence[int | None] | None = None,
                huge_pages: bool = True) -> tuple[HostArena, list[torch.Tensor]]:
    """One unpinned arena holding a contiguous tensor of each (shape, dtype), back to back at aligned
    offsets in the given order, and those tensors (views of it): a component read into one place.
    A tensor given a phase starts at that offset modulo a page instead (CPU: `offload.address_phase`)."""
    offsets: list[int] = []
    cursor = 0
    for (shape, dtype), phase in zip(specs, phases or [None] * len(specs), strict=True):
        if phase is not None:
            cursor += (phase - cursor) % PAGE  # the arena starts on a page
        offsets.append(cursor)
        cursor = align_up(cursor + math.prod(shape) * dtype.itemsize, ALIGNMENT)
    arena = HostArena(cursor, pin=False, huge_pages=huge_pages)
    return arena, [typed_view(arena.tensor, offset, dtype, shape, contiguous_stride(shape))
                   for offset, (shape, dtype) in zip(offsets, specs, strict=True)]


def typed_view(
    buffer: torch.Tensor, byte_offset: int, dtype: torch.dtype, shape: Sequence[int], stride: Sequence[int]
) -> torch.Tensor:
    """A `dtype` view with `shape`/`stride` over `buffer` (uint8) starting at `byte_offset`."""
    itemsize = dtype.itemsize
    if byte_offset % itemsize:
        raise ValueError(f"offset {byte_offset} is not aligned to {dtype} ({itemsize} bytes)")
    n_elem = span_elements(shape, stride)
    flat = buffer[byte_offset : byte_offset + max(n_elem, 1) * itemsize].view(dtype)
    return flat.as_strided(tuple(shape), tuple(stride))
