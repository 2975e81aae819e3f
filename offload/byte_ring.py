"""The prefetch ring budgeted in bytes: one device buffer, streamed units admitted in order while they fit.

`BlockResidency.byte_ring` selects it (the plan does for UNets, whose units differ in size by 300x);
without it the ring is `BlockRing`'s k equal slots, unchanged. The buffer has the bytes k slots would
have (k times the largest streamed unit), so the plan's forecast holds either way; where units go in
it is `RingLayout` (offload/ring_layout.py): each at a fixed offset, its tensors bound there once at
attach (no per-step re-pointing). The protocol is `BlockRing`'s with units for slots: a unit's
pre-hook waits for its copy (or copies it synchronously when the ring missed it), its post-hook
frees it and admits, on the copy stream, every following unit whose bytes are now free, cyclically
across forwards, so the next forward's first units arrive during this one's tail.
"""

from __future__ import annotations

from typing import Any

import torch

from .address_phase import device_bytes, place_like
from .block_packing import Block, bind_region
from .block_ring import BlockRing
from .devices import current_stream, stream_context
from .pinned import ALIGNMENT, align_up
from .ring_layout import PAGE, RingLayout


class ByteRing(BlockRing):
    """`BlockRing` whose slots become one byte buffer when `residency.byte_ring` is set."""

    _layout: RingLayout | None = None
    _ready: dict[int, Any]
    _all_fit: bool = False  # every streamed unit fits at once: placed at attach, never evicted
    _next_unit: int = 0  # the unit after the newest placed one: the next to admit

    @property
    def _bytes_mode(self) -> bool:
        return self.residency.byte_ring

    @property
    def num_slots(self) -> int:
        """Device slots allocated now; a byte ring counts the slots its bytes stand for."""
        if self._bytes_mode:
            return self.residency.slots if self._slots else 0
        return len(self._slots)

    def ring_capacity(self, slots: int) -> int:
        """Bytes of a byte ring standing for `slots` slots: each a largest unit, whole pages on a CPU."""
        return slots * align_up(max(self._slot_nbytes(), 1), self._align)  # zero-byte units: one alignment

    @property
    def _align(self) -> int:
        return ALIGNMENT if self._cuda else PAGE  # a CPU unit starts on a page: it keeps its phase

    def block_states(self) -> list[tuple[str, str, int]]:
        if not self._bytes_mode:
            return super().block_states()
        index = {id(b): k for k, b in enumerate(self._streamed)}
        out: list[tuple[str, str, int]] = []
        for b in self._blocks:
            ready = getattr(self, "_ready", {}).get(index.get(id(b), -1))
            if b.resident:
                state = "resident"
            elif b.slot is None:
                state = "host"
            elif self._cuda and ready is not None and not ready.query():
                state = "in_flight"
            else:
                state = "device"
            out.append((b.name, state, b.tensor_bytes))
        return out

    def _fill_ring(self) -> None:
        if not self._bytes_mode:
            super()._fill_ring()
            return
        capacity = self.ring_capacity(self.residency.slots)
        self._slots = [place_like(device_bytes, capacity, self.device, 0)]  # one buffer; a page on a CPU
        self._slot_owner, self._slot_ready, self._last_slot = [None], [None], None
        self._layout = RingLayout([b.region_nbytes for b in self._streamed], capacity, self._align)
        self._ready = {}
        self._next_unit = 0
        for k, b in enumerate(self._streamed):  # bound for good: a unit's bytes are always in one place
            bind_region(b, self._region(k))
        if self._upcast is not None:
            self._upcast.size_for(self._streamed)
        self._load_unit(0, sync=True)
        self._admit()
        self._all_fit = self._layout.disjoint

    def _clear_ring(self) -> None:
        super()._clear_ring()  # unbinds every streamed unit
        self._layout, self._ready, self._all_fit = None, {}, False

    def _before(self, k: int) -> None:
        if not self._bytes_mode:
            super()._before(k)
            return
        if self._cuda:
            self._absorb(self._clock.poll())
        layout = self._layout
        assert layout is not None
        synced = False
        if not layout.holds(k):  # the ring's order missed it: drop what is in flight, copy it now
            self._drop_live()
            self._load_unit(k, sync=True)
            synced = True
            self._sync_fetches += 1
        elif not self._all_fit:
            while layout.live[0] != k:  # units this forward skipped: their bytes are free again
                self._free(layout.pop())
        ready = self._ready.get(k)
        if self._cuda and not synced and ready is not None:
            compute = current_stream(self.device)
            mark = self._clock.start(compute)
            compute.wait_event(ready)
            self._clock.finish(mark, "stall", self._streamed[k].name, 0, stream=compute)
        if self._upcast is not None:
            self._upcast.run(self._streamed[k], self._region(k))
        self._admit()  # normally a no-op: the post-hooks keep the ring full

    def _after(self, k: int) -> None:
        """Free unit k and admit every following unit that now fits (see `BlockRing._after` for why here)."""
        if not self._bytes_mode:
            super()._after(k)
            return
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
        b = self._streamed[k]
        assert self._layout is not None
        if not self._layout.place(k):
            raise RuntimeError(f"{b.name} does not fit the ring now")  # callers check or empty it first
        self._next_unit = (k + 1) % len(self._streamed)
        self._ready[k] = self._copy_unit(b, self._region(k), sync=sync)
        self._h2d_bytes += b.region_nbytes
        self._transfers += 1
        b.slot = 0

    def _region(self, k: int) -> torch.Tensor:
        assert self._layout is not None
        start, end = self._layout.span(k)
        return self._slots[0][start:end]

    def _copy_unit(self, b: Block, dst: torch.Tensor, *, sync: bool) -> Any:
        """Copy b's region from the arena into `dst` (one memcpy); returns the copy's end event on CUDA.

        An asynchronous copy runs on the copy stream after everything computed so far (the units that
        used these bytes before); a synchronous one on the compute stream."""
        assert self._arena is not None
        n, off = b.region_nbytes, b.region_offset
        src = self._arena.tensor[off : off + n]
        if not self._cuda:
            mark = self._clock.start()
            dst.copy_(src)
            self._clock.finish(mark, "copy", b.name, n, sync=sync)
            self._absorb(self._clock.poll())
            return None
        compute = current_stream(self.device)
        stream = compute if sync else self._copy_stream
        if not sync:
            stream.wait_stream(compute)
        with stream_context(stream):
            mark = self._clock.start(stream)
            dst.copy_(src, non_blocking=self._arena.pinned and not sync)
            return self._clock.finish(mark, "copy", b.name, n, sync=sync, stream=stream)

    def _drop_live(self) -> None:
        """Free every unit in the ring; the compute stream first waits for copies still writing them."""
        assert self._layout is not None
        if self._cuda and self._copy_stream is not None:
            current_stream(self.device).wait_stream(self._copy_stream)
        while self._layout.live:
            self._free(self._layout.pop())

    def _free(self, k: int) -> int:
        """Unit k's bytes may be overwritten from now on; its tensors stay bound there (not read until
        it is admitted again). Returns k."""
        self._ready.pop(k, None)
        self._streamed[k].slot = None
        return k
