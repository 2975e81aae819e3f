"""What one assignment of host tiers costs: host bytes, the page cache it needs, and the step's transfer time.

Torch-free; the single definition both the tier planner (tier_plan.py) and its exhaustive-search tests use.

Items are what the host keeps between uses: streamed blocks (`hot`: read once per forward) and the rest
(`cold`: staged encoder/VAE masters, an expert's resident blocks, live re-plan masters; read once per request,
switch or re-plan). Rules:
- pinned items count in the process's host peak (RSS) and against the pin cap;
- page-cache and disk items are read through pinned bounce rings (offload/tiers.py): one shared by the streamer
  and the layer-streamed encoders (offload/bounce_pool.py: lent to each in turn), whose slots hold the largest
  file-tier block's read (a hot block, or an expert's resident block read whole at a switch: `HostItem.whole`)
  or encoder layer (`HostItem.layer_slot`), and the staged components' (offload/file_stager.py), whose slots
  hold the largest file-tier cold item's chunk (`HostItem.chunk`: a whole component is read in
  `stage_chunk_bytes`, a layer-streamed encoder's non-layer weights likewise); each ring costs nothing when
  nothing is read through it;
- a file tier holds and reads the file's bytes (`HostItem.file_bytes`): with fp8 storage of a 16-bit
  checkpoint the pinned tier holds the fp8 bytes, the page cache and disk the 16-bit ones (converted on the
  host after each read, offload/tier_filler.py);
- page-cache items are not the process's memory, but the kernel's cache must hold them or every read is a
  disk read: fixed + pinned + ring + page cache <= the budget;
- the step's transfer: every streamed byte crosses the link whatever its tier, while the file tiers' reads run
  beside those copies (their own ring slots), so one forward's transfer is
  max(streamed bytes / link, page-cache bytes / page-cache rate + disk bytes / disk rate), and the step is
  max(compute, that) per forward (`step_seconds`). With two experts the forward is the running expert's
  (`HostItem.forward`), the slowest one counted. A cold item's read costs its bytes over the slower of its tier
  and the link, so pinned is never slower for it either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...offload.tiers import Tier, TierRates, bounce_ring_bytes, stage_chunk_bytes

GIB = 2**30
# rates used where nothing was measured yet (bytes/s): PCIe 4 x16 pinned copies, one-stream reads of cached
# pages and of an NVMe through O_DIRECT as peers report them (next_wave.md §2); the plan says "unmeasured"
DEFAULT_RATES = TierRates(link=20e9, page_cache=3.5e9, disk=2.5e9)


@dataclass(frozen=True, slots=True)
class HostItem:
    """One thing the host keeps: its bytes as stored (fp8 storage: the fp8 bytes), whether it is read every
    forward, and which forward reads it (two experts: 0 or 1).

    `read_nbytes`: what a page-cache or disk read of it brings from its file, and the page cache holds (0: its
    `nbytes`); more where the file stores a wider dtype that the read converts on the host (a 16-bit
    checkpoint under `--stream-dtype fp8`: twice an fp8 linear's bytes; an fp8 checkpoint: the same). `whole`:
    a cold item read whole through one slot of the streamer's ring (an expert's resident block,
    offload/streamer.py), not in `chunk` pieces through the staged components' ring (a staged component)."""

    nbytes: int
    hot: bool = True
    forward: int = 0
    chunk: int = 0  # a cold item's bytes per slot of its own ring (a layer-streamed encoder: its rest's); 0: default
    read_nbytes: int = 0
    whole: bool = False
    layer_slot: int = 0  # a layer-streamed encoder's largest layer: its slot in the ring it shares with the blocks

    @property
    def file_bytes(self) -> int:
        """Bytes one read from its file moves (and the page cache holds)."""
        return self.read_nbytes or self.nbytes

    @property
    def in_streamer_ring(self) -> bool:
        """Read through the streamer's ring (a block); else through the staged components' ring."""
        return self.hot or self.whole

    @property
    def slot_basis(self) -> int:
        """What one bounce slot of its ring must hold to read it: the whole read, or one chunk of a staged
        component."""
        if self.in_streamer_ring:
            return self.file_bytes
        if self.layer_slot:
            return self.chunk  # its layers go through the shared ring (`shared_slot`), the rest through its own
        return self.chunk or min(self.file_bytes, stage_chunk_bytes(self.file_bytes))

    @property
    def shared_slot(self) -> int:
        """What one slot of the ring shared by the streamer's blocks and the encoders' layers must hold for it."""
        return self.slot_basis if self.in_streamer_ring else self.layer_slot


@dataclass(frozen=True, slots=True)
class TierCost:
    """An assignment's host figures and step transfer (seconds per forward, None: nothing streamed)."""

    pinned_bytes: int
    page_cache_bytes: int
    disk_bytes: int
    ring_bytes: int
    host_peak_bytes: int  # fixed + pinned + ring: the process's RSS at its peak (the page cache excluded)
    file_seconds: float  # one forward's hot reads from the page cache and disk
    link_seconds: float  # one forward's hot bytes over the link
    cold_seconds: float  # every cold item read once from its tier

    @property
    def transfer_seconds(self) -> float:
        return max(self.link_seconds, self.file_seconds)

    def fits(self, budget: int, pin_cap: int, fixed: int) -> bool:
        """Within the budget (the page cache's share included) and the pin cap."""
        return (self.pinned_bytes + self.ring_bytes <= pin_cap
                and fixed + self.pinned_bytes + self.ring_bytes + self.page_cache_bytes <= budget)


def known_rates(rates: TierRates) -> TierRates:
    """`rates` with every unmeasured one replaced by its default."""
    return TierRates(*(r if r else d for r, d in ((rates.link, DEFAULT_RATES.link),
                                                 (rates.page_cache, DEFAULT_RATES.page_cache),
                                                 (rates.disk, DEFAULT_RATES.disk))))


def ring_basis(items: Sequence[HostItem], tiers: Sequence[Tier]) -> tuple[int, int]:
    """The bytes one bounce slot of each ring must hold: (the shared one's: the largest file-tier block's read or
    layer-streamed encoder's layer, offload/bounce_pool.py; the staged components': the largest file-tier cold
    item's chunk); 0 where nothing is read through that ring."""
    filed = [i for i, t in zip(items, tiers, strict=True) if t != "pinned"]
    return (max((i.shared_slot for i in filed), default=0),
            max((i.slot_basis for i in filed if not i.in_streamer_ring), default=0))


def rings_bytes(hot_basis: int, cold_basis: int) -> int:
    """Host bytes of the two bounce rings (see the module docstring) for these slot sizes."""
    return bounce_ring_bytes(hot_basis) + bounce_ring_bytes(cold_basis)


def tier_cost(items: Sequence[HostItem], tiers: Sequence[Tier], rates: TierRates, fixed: int) -> TierCost:
    """The figures of `tiers` (one per item) at `rates` (unmeasured ones: `DEFAULT_RATES`) with `fixed` host bytes."""
    r = known_rates(rates)
    assert r.link and r.page_cache and r.disk
    by = {"pinned": 0, "page_cache": 0, "disk": 0}
    forwards: dict[int, list[float]] = {}
    cold = 0.0
    for item, tier in zip(items, tiers, strict=True):
        read = item.nbytes if tier == "pinned" else item.file_bytes  # a file tier holds and reads the file's
        by[tier] += read
        rate = r.rate(tier)
        assert rate
        if item.hot:
            link_s, file_s = forwards.setdefault(item.forward, [0.0, 0.0])
            forwards[item.forward] = [link_s + item.nbytes / r.link,
                                      file_s + (read / rate if tier != "pinned" else 0.0)]
        else:  # read once, from its tier and over the link: the slower of the two
            cold += max(read / rate, item.nbytes / r.link)
    ring = rings_bytes(*ring_basis(items, tiers))
    link_s = max((f[0] for f in forwards.values()), default=0.0)
    file_s = max((f[1] for f in forwards.values()), default=0.0)
    return TierCost(by["pinned"], by["page_cache"], by["disk"], ring, fixed + by["pinned"] + ring, file_s, link_s,
                    cold)


def pin_cap(budget: int) -> int:
    """Page-locked bytes allowed under a host budget: ComfyUI's Linux rule with the budget as the host's RAM and
    no swap term (we never swap): max(40 %, min(90 %, budget - 4 GiB)). Pinned pages cannot be reclaimed, so
    the kernel keeps at least a tenth (or 4 GiB) for the page cache, the file tiers' reads and everything else,
    but never less than the 40 % share that mmgp and Windows allow."""
    return max(int(0.4 * budget), min(int(0.9 * budget), budget - 4 * GIB))
