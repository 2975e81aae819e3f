"""What a streamed block in a file tier is made of: its reads (file runs into a bounce slot) and the copies from
the slot to its region (offload/tier_filler.py), and the tiers' read figures."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from .file_spans import Run
from .tiers import Tier

_Stored = tuple[Any, torch.dtype, int, int, torch.dtype]  # a tensor's file range, via, region offset, bytes, dtype


@dataclass(frozen=True, slots=True)
class _Copy:
    """One tensor of a file-tier block: its bytes at `slot_offset` of the bounce slot, stored as `stored`,
    go to `region_offset` of the device slot as `dtype` (`nbytes` there), converted through `via`."""

    slot_offset: int
    stored_nbytes: int
    stored: torch.dtype
    via: torch.dtype
    region_offset: int
    dtype: torch.dtype
    nbytes: int


@dataclass(slots=True)
class _FileBlock:
    tier: Tier
    reads: list[Run]
    copies: list[_Copy]
    extras: list[tuple[int, torch.Tensor]]  # bytes not in any file (buffers made at build): region offset, bytes
    slot_bytes: int  # bounce bytes its reads use


@dataclass(slots=True)
class _Pending:
    name: str
    slot: int
    futures: list[Future[int]] = field(default_factory=list)


@dataclass(slots=True)
class TierReadStats:
    """Bytes read per file tier and the seconds reads were outstanding (overlaps counted once)."""

    bytes: dict[str, int] = field(default_factory=lambda: {"page_cache": 0, "disk": 0})
    seconds: dict[str, float] = field(default_factory=lambda: {"page_cache": 0.0, "disk": 0.0})

    def rate(self, tier: Tier) -> float | None:
        """Bytes per second read from `tier` so far (None before any read)."""
        s = self.seconds.get(tier, 0.0)
        return self.bytes.get(tier, 0) / s if s > 0 else None
