"""The prefetch ring: k device slots that hold the block that runs and the next k-1 streamed blocks.

`LayerwiseStreamer` (offload/streamer.py) owns the blocks, the arena and their lifecycle; this is
the part that runs during a forward. Each streamed block's pre-hook makes sure its bytes are in a
slot (waiting on the slot's copy event, or copying synchronously when the ring missed it) and its
post-hook frees the slot and refills it at once with the block k slots ahead, on the copy stream,
so copies run ahead of compute. The ring also accounts the copies (stall, bytes, the link's rate)
and publishes each as a staging event.

An AllGather streamer (offload/allgather_streamer.py) replaces `_fill_slot` and `_slot_nbytes`:
the ring's protocol is the same whichever way a slot is filled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .address_phase import device_bytes, place_like
from .block_packing import Block, bind_region, unbind_region
from .devices import current_stream, stream_context, synchronize
from .events import EventBus, StagingEvent
from .pinned import HostArena
from .residency import BlockResidency
from .transfer_timing import Measured, TransferClock
from .upcast import BlockUpcast


class BlockRing:
    """The ring's slots and forward protocol over the streamer's state (set by `LayerwiseStreamer`)."""

    device: torch.device
    residency: BlockResidency
    _cuda: bool
    _bus: EventBus
    _arena: HostArena | None
    _blocks: list[Block]
    _streamed: list[Block]
    _slots: list[torch.Tensor]
    _slot_owner: list[int | None]
    _slot_ready: list[Any]
    _last_slot: int | None
    _copy_stream: Any
    _clock: TransferClock
    _stall_s: float
    _h2d_bytes: int
    _transfers: int
    _sync_fetches: int
    _async_bytes: int
    _async_seconds: float
    _upcast: BlockUpcast | None

    @property
    def largest_block_bytes(self) -> int:
        return max((b.region_nbytes for b in self._streamed), default=0)

    @property
    def slot_bytes(self) -> int:
        """Device bytes held by the slots (`residency.slots` of them while attached)."""
        return sum(s.numel() for s in self._slots)

    @property
    def num_slots(self) -> int:
        """Device slots allocated now (`residency.slots` while attached, 0 otherwise)."""
        return len(self._slots)

    @property
    def observed_bandwidth(self) -> float | None:
        """Bytes per second of the block copies resolved so far (None before any): the asynchronous ones
        on CUDA (a synchronous warm-up copy would understate the link), every copy on a CPU."""
        return self._async_bytes / self._async_seconds if self._async_seconds > 0 else None

    def block_states(self) -> list[tuple[str, str, int]]:
        """(name, state, bytes) per block; state is resident / device / in_flight / host."""
        out: list[tuple[str, str, int]] = []
        ready = list(self._slot_ready)
        for b in self._blocks:
            if b.resident:
                out.append((b.name, "resident", b.tensor_bytes))
                continue
            slot = b.slot
            if slot is None:
                state = "host"
            elif self._cuda and slot < len(ready) and ready[slot] is not None and not ready[slot].query():
                state = "in_flight"
            else:
                state = "device"
            out.append((b.name, state, b.tensor_bytes))
        return out

    def _fill_ring(self) -> None:
        """Slots for the streamed blocks (`residency.slots`, never more than them), warm window."""
        largest = self._slot_nbytes()
        nslots = self.residency.slots
        # on a CPU each slot starts on a page: a block bound there keeps its tensors' phase (`plan_block`)
        self._slots = [place_like(device_bytes, largest, self.device, 0) for _ in range(nslots)]
        self._slot_owner = [None] * nslots
        self._slot_ready = [None] * nslots
        self._last_slot = None
        if self._upcast is not None:
            self._upcast.size_for(self._streamed)
        self._load(0, 0, sync=True)
        self._fill_window(0)

    def _clear_ring(self) -> None:
        """Wait for every copy, account it, unbind the streamed blocks and free the slots (hooks stay)."""
        synchronize(self.device)
        self._absorb(self._clock.drain() if self._cuda else self._clock.poll())
        for k in range(len(self._streamed)):
            self._unbind(k)
        self._slots, self._slot_owner, self._slot_ready, self._last_slot = [], [], [], None

    def _make_pre_hook(self, k: int) -> Callable[..., None]:
        @torch.compiler.disable
        def pre_hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            self._before(k)

        return pre_hook

    def _make_post_hook(self, k: int) -> Callable[..., None]:
        @torch.compiler.disable
        def post_hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            self._after(k)

        return post_hook

    def _before(self, k: int) -> None:
        if self._cuda:
            self._absorb(self._clock.poll())
        b = self._streamed[k]
        synced = False
        if b.slot is None or self._slot_owner[b.slot] != k:
            held = self._slot_of(k)
            if held is not None:
                self._bind(k, held)  # its bytes are still in a slot: no copy needed
            else:
                self._load(k, self._free_slot(k), sync=True)
                synced = True
                self._sync_fetches += 1  # the ring missed: compute waits for the whole copy
        slot = b.slot
        assert slot is not None
        ready = self._slot_ready[slot]
        if self._cuda and not synced and ready is not None:
            compute = current_stream(self.device)
            mark = self._clock.start(compute)
            compute.wait_event(ready)
            self._clock.finish(mark, "stall", b.name, 0, stream=compute)
        self._last_slot = slot
        if self._upcast is not None:  # fp8 storage: convert on the compute stream, after the copy's wait
            self._upcast.run(b, self._slots[slot])
        self._fill_window(k)  # normally a no-op: the post-hooks keep the window full

    def _after(self, k: int) -> None:
        """Free block k's slot and refill it at once with the block k slots ahead.

        Issuing that copy here rather than at a later pre-hook changes nothing inside a forward,
        but at the end of one it starts the next step's first copies while the tail modules, the
        scheduler step, the next forward's embeddings and any resident prefix run — the link would
        otherwise idle there once per step.
        """
        if len(self._streamed) > len(self._slots):
            self._unbind(k)
            self._fill_window((k + 1) % len(self._streamed))

    def _window(self, base: int) -> list[int]:
        """The streamed blocks the ring should hold from `base` on: base and the next k-1 (cyclic)."""
        n = len(self._streamed)
        return [(base + d) % n for d in range(min(len(self._slots), n))]

    def _slot_of(self, k: int) -> int | None:
        return next((s for s, owner in enumerate(self._slot_owner) if owner == k), None)

    def _free_slot(self, base: int) -> int:
        """A slot whose block the window from `base` does not need: an empty one first, else the one
        whose block ran longest ago."""
        window = self._window(base)
        n = len(self._streamed)
        candidates = [s for s, owner in enumerate(self._slot_owner) if owner not in window]
        return max(candidates, key=lambda s: n if self._slot_owner[s] is None else (base - self._slot_owner[s]) % n)

    def _fill_window(self, base: int) -> None:
        """Issue async copies, in execution order, for the window's blocks that no slot holds yet."""
        if len(self._slots) < 2:
            return
        for j in self._window(base):
            if self._slot_of(j) is None:
                self._load(j, self._free_slot(base), sync=False)

    def _load(self, k: int, slot: int, *, sync: bool) -> None:
        """Copy block k's region into `slot` (one memcpy) and point its tensors there."""
        b = self._streamed[k]
        prev = self._slot_owner[slot]
        if prev is not None and prev != k and self._streamed[prev].slot == slot:
            self._unbind(prev)
        self._slot_owner[slot] = None
        n = self._fill_slot(b, slot, sync=sync)
        self._slot_owner[slot] = k
        self._h2d_bytes += n
        self._transfers += 1
        self._bind(k, slot)

    def _fill_slot(self, b: Block, slot: int, *, sync: bool) -> int:
        """Copy block b's region from the arena into `slot` (one memcpy); returns the bytes copied.

        Async copies run on the copy stream after the slot's previous user has computed; the slot's
        ready event is what the block's pre-hook waits for."""
        assert self._arena is not None
        n, off = b.region_nbytes, b.region_offset
        src = self._arena.tensor[off : off + n]
        dst = self._slots[slot][:n]
        if self._cuda:
            compute = current_stream(self.device)
            if sync:
                stream = compute
                if self._slot_ready[slot] is not None:
                    stream.wait_event(self._slot_ready[slot])  # an async copy may still write it
            else:
                stream = self._copy_stream
                stream.wait_stream(compute)  # the slot's previous user has finished computing
            with stream_context(stream):
                mark = self._clock.start(stream)
                dst.copy_(src, non_blocking=self._arena.pinned and not sync)
                self._slot_ready[slot] = self._clock.finish(mark, "copy", b.name, n, sync=sync, stream=stream)
        else:
            mark = self._clock.start()
            dst.copy_(src)
            self._clock.finish(mark, "copy", b.name, n, sync=sync)
            self._absorb(self._clock.poll())
        return n

    def _slot_nbytes(self) -> int:
        """Bytes of one ring slot: the largest streamed region."""
        return self.largest_block_bytes

    def _bind(self, k: int, slot: int) -> None:
        b = self._streamed[k]
        bind_region(b, self._slots[slot])
        b.slot = slot

    def _unbind(self, k: int) -> None:
        b = self._streamed[k]
        unbind_region(b, self.device)
        b.slot = None

    def _absorb(self, measured: list[Measured]) -> None:
        """Account resolved measurements and publish the copies as staging events."""
        for m in measured:
            if m.kind == "stall" or m.sync or not self._cuda:
                self._stall_s += m.seconds
            if m.kind == "copy" and (not m.sync or not self._cuda) and m.seconds > 0:  # on a CPU all are sync
                self._async_bytes += m.nbytes
                self._async_seconds += m.seconds
            if m.kind == "copy":
                self._bus.publish(
                    StagingEvent(target=m.target, direction="h2d", nbytes=m.nbytes, seconds=m.seconds, sync=m.sync,
                                 t=m.t)
                )
