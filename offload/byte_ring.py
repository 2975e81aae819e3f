"""The prefetch ring budgeted in bytes: one device buffer, streamed units admitted in order while they fit.

`BlockResidency.byte_ring` selects it (the plan does for UNets, whose units differ in size by 300x);
without it the streamer builds `SlotRing`'s k equal slots (offload/slot_ring.py), unchanged. The
buffer has the bytes k slots would have (k times the largest streamed unit), so the plan's forecast
holds either way; where units go in it is `RingLayout` (offload/ring_layout.py): each at a fixed
offset, its tensors bound there once at `open` (no per-step re-pointing). The protocol is
`SlotRing`'s with units for slots: a unit's pre-hook (`before`) waits for its copy (or copies it
synchronously when the ring missed it), its post-hook (`after`) frees it and admits, on the copy
stream, every following unit whose bytes are now free, cyclically across forwards, so the next
forward's first units arrive during this one's tail. The slot filler moves the bytes, as for
`SlotRing`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .address_phase import device_bytes, place_like
from .block_packing import Block, bind_region, unbind_region
from .copy_ledger import CopyLedger
from .devices import current_stream, is_cuda, synchronize
from .pinned import ALIGNMENT, align_up
from .ring_layout import PAGE, RingLayout
from .slot_filler import SlotFiller
from .slot_ring import block_state
from .upcast import BlockUpcast


def ring_capacity(slots: int, largest: int, cuda: bool) -> int:
    """Bytes of a byte ring standing for `slots` slots: each a largest unit, whole pages on a CPU."""
    return slots * align_up(max(largest, 1), ALIGNMENT if cuda else PAGE)  # zero-byte units: one alignment


class ByteRing:
    """The ring's slots as one byte buffer (see the module docstring); `SlotRing`'s interface."""

    def __init__(self, streamed: list[Block], device: torch.device, filler: SlotFiller, ledger: CopyLedger,
                 upcast: BlockUpcast | None) -> None:
        self.streamed = streamed
        self.device = device
        self.cuda = is_cuda(device)
        self.slots: list[torch.Tensor] = []  # the one buffer while open
        self._nslots = 0
        self._layout: RingLayout | None = None
        self._ready: dict[int, Any] = {}
        self._all_fit = False  # every streamed unit fits at once: placed at open, never evicted
        self._next_unit = 0  # the unit after the newest placed one: the next to admit
        self._filler = filler
        self._fill = filler.fill
        self._ledger = ledger
        self._clock = ledger.clock
        self._absorb = ledger.absorb
        self._upcast = upcast
        self.skip: Callable[[int], bool] | None = None  # not followed: a byte ring copies every unit (UNets)
        self.skipping = False  # never: every unit runs

    @property
    def num_slots(self) -> int:
        """The slots the buffer's bytes stand for while open, 0 otherwise."""
        return self._nslots if self.slots else 0

    def ring_capacity(self, slots: int) -> int:
        return ring_capacity(slots, self._filler.slot_nbytes(self.streamed), self.cuda)

    @property
    def _align(self) -> int:
        return ALIGNMENT if self.cuda else PAGE  # a CPU unit starts on a page: it keeps its phase

    def block_states(self, blocks: list[Block]) -> list[tuple[str, str, int]]:
        """(name, state, bytes) per block; state is resident / device / in_flight / host."""
        index = {id(b): k for k, b in enumerate(self.streamed)}
        return [(b.name, block_state(b, self._ready.get(index.get(id(b), -1)), self.cuda), b.tensor_bytes)
                for b in blocks]

    def open(self, nslots: int) -> None:
        """Allocate the buffer for `nslots` slots' bytes, bind every unit at its offset, warm the ring."""
        capacity = self.ring_capacity(nslots)
        self._nslots = nslots
        self.slots = [place_like(device_bytes, capacity, self.device, 0)]  # one buffer; a page on a CPU
        self._layout = RingLayout([b.region_nbytes for b in self.streamed], capacity, self._align)
        self._ready = {}
        self._next_unit = 0
        for k, b in enumerate(self.streamed):  # bound for good: a unit's bytes are always in one place
            bind_region(b, self._region(k))
        if self._upcast is not None:
            self._upcast.size_for(self.streamed)
        self._load_unit(0, sync=True)
        self._admit()
        self._all_fit = self._layout.disjoint

    def retarget(self) -> None:
        """A step cache's decision: a byte ring does not follow it (it admits units in order)."""

    def close(self) -> None:
        """Wait for every copy, account it, unbind every unit and free the buffer (hooks stay)."""
        synchronize(self.device)
        self._ledger.settle()
        for b in self.streamed:
            unbind_region(b, self.device)
            b.slot = None
        self.slots = []
        self._layout, self._ready, self._all_fit = None, {}, False

    def before(self, k: int) -> None:
        if self.cuda:
            self._absorb(self._clock.poll())
        layout = self._layout
        assert layout is not None
        synced = False
        if not layout.holds(k):  # the ring's order missed it: drop what is in flight, copy it now
            self._drop_live()
            self._load_unit(k, sync=True)
            synced = True
            self._ledger.sync_fetches += 1
        elif not self._all_fit:
            while layout.live[0] != k:  # units this forward skipped: their bytes are free again
                self._free(layout.pop())
        ready = self._ready.get(k)
        if self.cuda and not synced and ready is not None:
            compute = current_stream(self.device)
            mark = self._clock.start(compute)
            compute.wait_event(ready)
            self._clock.finish(mark, "stall", self.streamed[k].name, 0, stream=compute)
        if self._upcast is not None:
            self._upcast.run(self.streamed[k], self._region(k))
        self._admit()  # normally a no-op: the post-hooks keep the ring full

    def after(self, k: int) -> None:
        """Free unit k and admit every following unit that now fits (see `SlotRing.after` for why here)."""
        layout = self._layout
        if self._all_fit or layout is None or not layout.holds(k):
            return
        while self._free(layout.pop()) != k:
            pass
        self._admit()

    def _admit(self) -> None:
        """Copy the next units in execution order (cyclic) while each one's bytes are free."""
        layout = self._layout
        assert layout is not None
        while layout.fits(self._next_unit):
            self._load_unit(self._next_unit, sync=False)

    def _load_unit(self, k: int, *, sync: bool) -> None:
        b = self.streamed[k]
        assert self._layout is not None
        if not self._layout.place(k):
            raise RuntimeError(f"{b.name} does not fit the ring now")  # callers check or empty it first
        self._next_unit = (k + 1) % len(self.streamed)
        n, self._ready[k] = self._fill(b, self._region(k), sync=sync, previous=None)
        ledger = self._ledger
        ledger.h2d_bytes += n
        ledger.transfers += 1
        b.slot = 0

    def _region(self, k: int) -> torch.Tensor:
        assert self._layout is not None
        start, end = self._layout.span(k)
        return self.slots[0][start:end]

    def _drop_live(self) -> None:
        """Free every unit in the ring; the compute stream first waits for copies still writing them."""
        assert self._layout is not None
        copy_stream = self._filler.copy_stream
        if self.cuda and copy_stream is not None:
            current_stream(self.device).wait_stream(copy_stream)
        while self._layout.live:
            self._free(self._layout.pop())

    def _free(self, k: int) -> int:
        """Unit k's bytes may be overwritten from now on; its tensors stay bound there (not read until
        it is admitted again). Returns k."""
        self._ready.pop(k, None)
        self.streamed[k].slot = None
        return k
