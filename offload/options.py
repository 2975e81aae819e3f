"""The offload layer's load and stream switches, as frozen values passed down explicitly.

`LoadOptions` says how host arenas are filled and page-locked (`offload.arena_fill`, `offload.pinned`,
the stagers' masters); `StreamOptions` how an AllGather rank rebuilds its blocks (`offload.sharding`,
`offload.allgather_streamer`). The engine builds both from its `engine.options.EngineOptions`; a
benchmark or a test that measures a variant passes other values instead of patching a module. Every
default here is what loads and streams use when nobody says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .bounce_pool import BouncePool
    from .pinned import PageLocker


@dataclass(frozen=True)
class LoadOptions:
    """How blocks and components are read into host arenas and page-locked."""

    batch_bytes: int = 2 << 30
    """Read this much of the blocks, then hand it to the registering threads."""
    read_ahead_batches: int | None = 1
    """Batches queued beyond the one being finished (None: all). One keeps every reader busy at a
    batch's end (a cold disk feels an idle reader most) and leaves room in the queue for other
    components' reads."""
    register_threads: int = 4
    """Threads page-locking the landed batches: one falls behind 16 readers; four keep pace."""
    use_huge_pages: bool = True
    """Large arenas advised to use transparent huge pages (`offload.pinned`); the load benchmark turns
    this off to measure what they buy."""
    page_locker: PageLocker | None = None
    """What page-locks the streamed blocks' arena and bounce ring (None: CUDA's `cudaHostRegister`, on
    CUDA only). A test passes a double that refuses part way, on any device, to check that the blocks it
    refused are read from the page cache instead (`offload.tier_filler`)."""
    bounce_pool: BouncePool | None = field(default=None, compare=False, repr=False)
    """One bounce ring lent in turn to the load's file-tier readers (offload/bounce_pool.py; the engine gives
    each load its own). None: each reader keeps a ring of its own."""

    def __post_init__(self) -> None:
        if self.batch_bytes < 1:
            raise ValueError(f"batch_bytes must be >= 1, got {self.batch_bytes}")
        if self.read_ahead_batches is not None and self.read_ahead_batches < 0:
            raise ValueError(f"read_ahead_batches must be >= 0 or None, got {self.read_ahead_batches}")
        if self.register_threads < 1:
            raise ValueError(f"register_threads must be >= 1, got {self.register_threads}")


@dataclass(frozen=True)
class StreamOptions:
    """How an AllGather rank rebuilds a streamed block in its slot (`offload.allgather_streamer`)."""

    shard_buffers: int = 2
    """Shard buffers a rank cycles through (one gathered while the next fills)."""
    gather_in_place: bool = False
    """True: each rank copies its shard into its place in the slot and gathers in place (no shard
    buffers; NCCL skips the rank's own part)."""
    comm_priority: int = 0
    """The gathers' CUDA stream priority (0: as compute; -1: ahead of compute's kernels)."""

    def __post_init__(self) -> None:
        if self.shard_buffers < 1:
            raise ValueError(f"shard_buffers must be >= 1, got {self.shard_buffers}")


DEFAULT_LOAD = LoadOptions()
DEFAULT_STREAM = StreamOptions()
