"""Give the pages of host tensors that moved to the device back to the kernel, where freeing them would not.

A DiT is built with its weights as views into one arena mapping (engine/loading/loader.py `dit_in_arena`): its
streamed blocks are read into the streamer's arena, but its resident blocks and its other layers are read into
that mapping, then moved to the device. Their views go, yet the mapping stays whole until the last view of it
goes, so every resident block read during a load stayed resident in host memory until the load's end: measured on
an H100 (issue 35's flux16 plan, 14 resident Flux-size blocks), a 6.8 GB anonymous mapping at the load's peak,
which the host forecast's one-block read buffer does not name.

`release_moved_pages` takes the old host tensors (still referenced by the caller, so the memory is still theirs)
and advises the kernel that the whole pages inside each one's bytes are not needed (`MADV_DONTNEED`): the RSS goes
at once, and the pages read as zeros if touched again, which nothing does (the module's tensors point at the
device now). Only views into a larger storage (an arena's) are released: a tensor with a storage of its own goes
back to the allocator when it is freed, and page-locked memory is never touched.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterable

import torch

PAGE = mmap.PAGESIZE


def _madvise() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise() if hasattr(mmap, "MADV_DONTNEED") else None


def dontneed(address: int, nbytes: int) -> bool:
    """`MADV_DONTNEED` on whole pages at `address` (page-aligned): the kernel takes them back; False where it
    refused or there is no `madvise` to ask."""
    return _MADVISE is not None and _MADVISE(address, nbytes, mmap.MADV_DONTNEED) == 0


def _pinned(t: torch.Tensor) -> bool:
    try:
        return bool(t.is_pinned())
    except RuntimeError:  # no CUDA runtime to ask: nothing can be page-locked by it
        return False


def release_moved_pages(old: Iterable[torch.Tensor]) -> int:
    """Release the whole pages inside each host tensor's bytes where it is a view into a larger storage that is not
    page-locked; returns the bytes released. The caller holds `old` (so its storage is alive) and never reads it
    again."""
    if _MADVISE is None:
        return 0
    released = 0
    done: set[tuple[int, int]] = set()
    for t in old:
        if t.device.type != "cpu" or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        span = t.nbytes if t.is_contiguous() else 0
        if span == 0 or storage.nbytes() <= span or _pinned(t):
            continue  # its own storage (the allocator frees it), non-contiguous, or page-locked
        lo, hi = t.data_ptr(), t.data_ptr() + span
        start, end = -(-lo // PAGE) * PAGE, hi // PAGE * PAGE
        if end - start < PAGE or (start, end) in done:
            continue
        if dontneed(start, end - start):
            done.add((start, end))
            released += end - start
    return released
