"""How AllGather DLO splits each block across ranks: vLLM-Omni's arithmetic, on byte regions.

With N ranks every rank keeps `ceil(total / N)` elements of a block — rank r the slice starting at
r·shard — and the last rank's short slice is zero-padded, so an `all_gather_into_tensor` of the
equal-sized shards rebuilds the block (plus at most N-1 padding elements) on every rank. vLLM-Omni
applies it per dtype group of a block; the streamer applies it to the block's packed byte region
(one region per block, every dtype inside), which needs one gather per block instead of one per dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch-free at import: the planner (`plan`) does the arithmetic without torch
    import torch

# The shard-buffer count, in-place gathers and the gathers' stream priority: `offload.options.StreamOptions`.


@dataclass(frozen=True, slots=True)
class Shard:
    """Rank `rank`'s part of `total` elements: [start, stop) of the original, `size` after padding."""

    total: int
    world: int
    rank: int

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in a world of {self.world}")
        if self.total < 0:
            raise ValueError(f"total must be >= 0, got {self.total}")

    @property
    def size(self) -> int:
        """Elements every rank holds: ceil(total / world)."""
        return -(-self.total // self.world)

    @property
    def start(self) -> int:
        return min(self.rank * self.size, self.total)

    @property
    def stop(self) -> int:
        return min(self.start + self.size, self.total)

    @property
    def gathered(self) -> int:
        """Elements after the gather: world x size (the block plus its padding)."""
        return self.world * self.size

    def take(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's shard of the 1-D `full`, zero-padded to `size` (a new tensor)."""
        if full.dim() != 1 or full.numel() != self.total:
            raise ValueError(f"expected a 1-D tensor of {self.total} elements, got shape {tuple(full.shape)}")
        import torch

        out = torch.zeros(self.size, dtype=full.dtype, device=full.device)
        out[: self.stop - self.start] = full[self.start : self.stop]
        return out
