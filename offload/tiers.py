"""Where a weight lives on the host between its uses: the storage tiers and their measured rates.

Torch-free, shared by the planner (engine/planning) and the runtime (offload/): the planner decides a
tier for every streamed block and every staged component's master, the runtime reads the bytes from
there. Resident weights ("on the device") are the residency's business (offload/residency.py), not a
host tier.

- `pinned`: page-locked host memory, copied to the device at the link's rate (today's path);
- `page_cache`: not held by the process; read from its file through the kernel's page cache into a
  small pinned bounce ring, then copied (counts against host memory only as the kernel's cache, which
  it may drop);
- `disk`: read from its file with O_DIRECT (aligned reads into pinned slots, several in flight),
  bypassing the page cache, for data the cache cannot hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Tier = Literal["pinned", "page_cache", "disk"]
TIERS: tuple[Tier, ...] = ("pinned", "page_cache", "disk")


@dataclass(frozen=True, slots=True)
class HostTiers:
    """The planner's tier for each streamed block (execution order) and each staged component.

    Empty `blocks` means every block is pinned; a component not named in `components` is pinned. The
    default value is today's behaviour: everything pinned."""

    blocks: tuple[Tier, ...] = ()
    components: tuple[tuple[str, Tier], ...] = ()

    def block(self, index: int) -> Tier:
        """The tier of block `index` (execution order)."""
        return self.blocks[index] if index < len(self.blocks) else "pinned"

    def component(self, name: str) -> Tier:
        """The tier of a staged component's master."""
        return dict(self.components).get(name, "pinned")

    @property
    def all_pinned(self) -> bool:
        return all(t == "pinned" for t in self.blocks) and all(t == "pinned" for _, t in self.components)


ALL_PINNED = HostTiers()


@dataclass(frozen=True, slots=True)
class TierRates:
    """Measured bytes per second of each tier into device memory's staging side (None: not measured).

    `link`: pinned host → device; `page_cache`: a file's cached pages → pinned bounce buffer;
    `disk`: O_DIRECT reads of uncached data → pinned slots."""

    link: float | None = None
    page_cache: float | None = None
    disk: float | None = None

    def rate(self, tier: Tier) -> float | None:
        """The rate a tier's bytes reach the pinned side (pinned: the link)."""
        return {"pinned": self.link, "page_cache": self.page_cache, "disk": self.disk}[tier]


PAGE = 4096  # O_DIRECT's alignment of file offsets, lengths and buffers
BOUNCE_SLOTS = 4  # pinned bounce slots of the page-cache/disk tiers: reads in flight + the one being copied
COLD_CHUNK = 64 * 2**20  # bytes of a staged component read per bounce slot at most (sglang's O_DIRECT chunk, #38441)
MIN_CHUNK = 64 << 10  # and at least (a page multiple)


def bounce_slot_bytes(largest_block: int) -> int:
    """One bounce slot: the largest file-tier block's bytes widened to whole aligned pages at both ends."""
    return (largest_block + 2 * PAGE + PAGE - 1) // PAGE * PAGE


def bounce_ring_bytes(largest_block: int) -> int:
    """Pinned host bytes of the bounce ring that the page-cache and disk tiers read through (0 without
    file-tier blocks): what those tiers cost in host memory besides the kernel's cache."""
    return BOUNCE_SLOTS * bounce_slot_bytes(largest_block) if largest_block > 0 else 0


def stage_chunk_bytes(nbytes: int) -> int:
    """The read size (one bounce slot) of a staged component of `nbytes` read from a file tier: a sixteenth of it,
    between `MIN_CHUNK` and `COLD_CHUNK`, so that its ring (`BOUNCE_SLOTS` of them) is a quarter of the component
    at most and reading a small component from its files still saves host bytes over a pinned master."""
    share = (nbytes // 16 + PAGE - 1) // PAGE * PAGE
    return min(COLD_CHUNK, max(MIN_CHUNK, share))
