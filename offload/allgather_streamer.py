"""AllGather DLO: each rank pins 1/N of every streamed block and the ranks gather the block before it runs.

vLLM-Omni's default DLO mode: a `LayerwiseStreamer` (same ring, hooks, window, placement and ring
depth) composed with another slot filler, `AllGatherFiller` (offload/allgather_filler.py). What
changes is where a slot's bytes come from:
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

from typing import Any

from .allgather_filler import AllGatherFiller, gather_into
from .options import DEFAULT_STREAM, StreamOptions
from .streamer import LayerwiseStreamer

__all__ = ["AllGatherStreamer", "gather_into"]


class AllGatherStreamer(LayerwiseStreamer):
    """`LayerwiseStreamer` whose streamed blocks are sharded across the ranks of `group` (its filler is an
    `AllGatherFiller`; see the module docstring and `AllGatherFiller` for `stream_options`)."""

    filler: AllGatherFiller

    def __init__(self, *args: Any, group: Any = None, stream_options: StreamOptions = DEFAULT_STREAM,
                 **kwargs: Any) -> None:
        if kwargs.get("keep_masters"):
            raise ValueError("AllGather streaming keeps only shards: it cannot keep whole masters for re-plans")
        super().__init__(*args, **kwargs)
        self.filler = AllGatherFiller(self.device, self._ledger, group, stream_options, self._load_options)

    @property
    def group(self) -> Any:
        return self.filler.group

    @property
    def world(self) -> int:
        return self.filler.world

    @property
    def rank(self) -> int:
        return self.filler.rank

    @property
    def gathered_bytes(self) -> int:
        """Bytes other ranks supplied (NVLink on GPUs) since attach."""
        return self.filler.gathered_bytes

    @property
    def shard_bytes(self) -> int:
        """Bytes of this rank's shards in the arena (about streamed bytes / N)."""
        return self.filler.shard_bytes
