"""Layerwise streaming of DiT blocks through device slots.

Which blocks stream and how many slots they share is decided elsewhere (`BlockResidency`,
offload/residency.py — the plan's decision, passed in by placement); the streamer only carries it out.

Every streamed block's weights live once in one host arena (page-locked on CUDA), each block a
256-byte aligned region. A ring of k device slots (the plan's `residency.slots`; never more than
the streamed blocks), each the size of the largest region, holds the block that runs and the next
k-1 streamed blocks: when block i finishes, its slot is refilled at once with block i+k on a copy
stream, so copies run up to k-1 blocks ahead of compute. The order is cyclic: the last blocks of a
step copy the first ones of the next, which therefore arrive during the step's tail, the scheduler
and any resident blocks that run before them.

Swapping never replaces modules or Parameters: each tensor's storage is re-pointed
(`param.data = view into a slot`) and, after the block ran, to a zero-element placeholder.

On CPU there is no asynchrony: copies are plain synchronous copies, so all copy time is exposed
stall (a CPU cannot overlap them with compute); the protocol and the bit-exact results are the same.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import arena_fill
from .block_packing import (
    Block,
    bind_region,
    distinct_bytes,
    unbind_region,
    unique_tensors,
)
from .deferred_weights import DeferredWeights
from .devices import (
    as_device,
    current_stream,
    is_cuda,
    move_preserving_aliases,
    new_stream,
    placeholder,
    rebind,
    stream_context,
    synchronize,
    unview_buffers,
)
from .events import EventBus, NullBus, StagingEvent
from .pinned import HostArena, typed_view
from .residency import BlockResidency
from .transfer_timing import Measured, TransferClock


@dataclass(frozen=True, slots=True)
class ReplanStats:
    """What a `replan` moved: block regions copied to the device (newly resident), device bytes freed
    (newly streamed), the ring's warm-up copies, and the wall time including both synchronizations."""

    copied_bytes: int
    freed_bytes: int
    ring_bytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class StepStats:
    """Transfer totals since the previous `take_step_stats()` call.

    `stall_s`: time compute waited on weight copies (exposed stall). `h2d_bytes` / `transfers`:
    bytes and number of host-to-device block copies issued.
    """

    stall_s: float
    h2d_bytes: int
    transfers: int


class LayerwiseStreamer:
    """Streams the blocks of one or more block lists (execution order) through its device slots.

    `residency` (one flag per block, in execution order, and the slot count) is the plan's
    decision and is carried out as given. `resident_layers` is shorthand for
    `BlockResidency.leading(num_blocks, resident_layers)` for callers without a plan; give one or
    neither (neither: every block streamed).

    `keep_masters=True` packs every block, resident ones too, into the pinned arena and gives each
    resident block a device copy of its region: the arena then holds the whole DiT (pinned bytes =
    all blocks, not only the streamed ones), and in exchange `replan` can change which blocks are
    resident, where, and the ring's depth between requests by device copies alone.
    """

    def __init__(
        self,
        block_lists: Sequence[tuple[str, Sequence[torch.nn.Module]]],
        device: torch.device | str,
        *,
        residency: BlockResidency | None = None,
        resident_layers: int | None = None,
        bus: EventBus | None = None,
        pin: bool = True,
        progress: Callable[[int, int], None] | None = None,
        keep_masters: bool = False,
        weights: DeferredWeights | None = None,
    ) -> None:
        self.device = as_device(device)
        self._weights = weights  # blocks whose tensors are still in their files are read into the arena
        self.keep_masters = keep_masters
        self._cuda = is_cuda(self.device)
        blocks: list[tuple[str, torch.nn.Module]] = []
        for list_name, modules in block_lists:
            blocks.extend((f"{list_name}.{i}", m) for i, m in enumerate(modules))
        if residency is not None and resident_layers is not None:
            raise ValueError("give residency or resident_layers, not both")
        if residency is None:
            residency = BlockResidency.leading(len(blocks), resident_layers or 0)
        if residency.num_blocks != len(blocks):
            raise ValueError(f"residency covers {residency.num_blocks} blocks, the block lists hold {len(blocks)}")
        self.residency = residency
        self._blocks = [Block(name, m, resident=r) for (name, m), r in zip(blocks, residency.resident, strict=True)]
        self._streamed = [b for b in self._blocks if not b.resident]
        self._bus = bus or NullBus()
        self._pin = pin and self._cuda
        self._progress = progress
        self._attached = False
        self._released = False
        self._arena: HostArena | None = None
        self._slots: list[torch.Tensor] = []
        self._slot_owner: list[int | None] = []
        self._slot_ready: list[Any] = []
        self._last_slot: int | None = None
        self._handles: list[Any] = []
        self._copy_stream: Any = None
        self._clock = TransferClock(self._cuda)
        self._stall_s = 0.0
        self._h2d_bytes = 0
        self._transfers = 0
        self._resident_bytes = 0
        self._async_bytes = 0  # resolved asynchronous copies since attach: the link's rate as streamed
        self._async_seconds = 0.0

    # ------------------------------------------------------------------ public API

    @property
    def attached(self) -> bool:
        return self._attached

    @property
    def num_streamed(self) -> int:
        return len(self._streamed)

    @property
    def num_resident(self) -> int:
        return len(self._blocks) - len(self._streamed)

    @property
    def streamed_bytes(self) -> int:
        return sum(b.tensor_bytes for b in self._streamed)

    @property
    def host_bytes(self) -> int:
        return self._arena.nbytes if self._arena is not None and not self._arena.closed else 0

    @property
    def pinned_bytes(self) -> int:
        arena = self._arena
        return arena.pinned_bytes if arena is not None and arena.pinned else 0

    @property
    def pin_failure_reason(self) -> str | None:
        return self._arena.pin_failure_reason if self._arena is not None else None

    @property
    def resident_bytes(self) -> int:
        return self._resident_bytes

    @property
    def largest_block_bytes(self) -> int:
        return max((b.region_nbytes for b in self._streamed), default=0)

    @property
    def observed_bandwidth(self) -> float | None:
        """Bytes per second of the block copies resolved so far (None before any): the asynchronous ones
        on CUDA (a synchronous warm-up copy would understate the link), every copy on a CPU."""
        return self._async_bytes / self._async_seconds if self._async_seconds > 0 else None

    @property
    def slot_bytes(self) -> int:
        """Device bytes held by the slots (`residency.slots` of them while attached)."""
        return sum(s.numel() for s in self._slots)

    @property
    def num_slots(self) -> int:
        """Device slots allocated now (`residency.slots` while attached, 0 otherwise)."""
        return len(self._slots)

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

    def attach(self) -> None:
        """Pack streamed blocks into the host arena, allocate slots, install hooks, warm block 0."""
        if self._attached:
            return
        if self._released:
            raise RuntimeError("a detached streamer cannot attach again: its blocks were released (placeholders)")
        try:
            self._attach()
        except BaseException:
            self._abort_attach()
            raise
        self._attached = True

    def detach(self) -> None:
        """Remove hooks and free slots and arena; blocks are left as placeholders. Idempotent."""
        if not self._attached:
            return
        self._remove_hooks()
        synchronize(self.device)
        self._absorb(self._clock.drain() if self._cuda else self._clock.poll())
        for b in self._blocks:
            moved = b.resident and not b.packed  # resident without a master: moved as modules
            for t in unique_tensors(b.module) if moved else [x.target for x in b.bindings]:
                rebind(t, lambda t=t: placeholder(t.dtype, self.device))
            b.slot = None
            b.device_buffer = None
        self._release_buffers()
        self._attached = False
        self._released = True

    def set_slots(self, slots: int) -> None:
        """Change the ring's depth in place (no repacking): the slots are reallocated and refilled.

        Used between requests, when only the prefetch depth changes; the residency keeps its blocks."""
        if not self._attached or not self._streamed:
            raise RuntimeError("set_slots needs an attached streamer with streamed blocks")
        self._clear_ring()
        self.residency = BlockResidency(self.residency.resident, min(slots, len(self._streamed)),
                                        self.residency.placement)
        self._fill_ring()

    def replan(self, residency: BlockResidency) -> ReplanStats:
        """Carry out another residency between requests, from the arena's masters (no disk, no repacking).

        Blocks that become resident get a device copy of their region; blocks that become streamed
        free theirs and join the ring; the ring is rebuilt with the new depth. Needs `keep_masters`.
        """
        if not self.keep_masters:
            raise RuntimeError("this streamer keeps no host copy of its resident blocks: load with live re-plan on")
        if not self._attached:
            raise RuntimeError("replan needs an attached streamer")
        if residency.num_blocks != len(self._blocks):
            raise ValueError(f"residency covers {residency.num_blocks} blocks, the streamer holds {len(self._blocks)}")
        start = time.perf_counter()
        self._clear_ring()
        self._remove_hooks()
        copied = freed = 0
        for b, resident in zip(self._blocks, residency.resident, strict=True):
            if resident and not b.resident:
                b.resident = True
                copied += self._make_resident(b)
            elif b.resident and not resident:
                freed += self._drop_resident(b)
                b.resident = False
        self._streamed = [b for b in self._blocks if not b.resident]
        self.residency = residency
        self._resident_bytes = sum(b.tensor_bytes for b in self._blocks if b.resident)
        ring_before = self._h2d_bytes
        self._build_ring()
        synchronize(self.device)
        return ReplanStats(copied_bytes=copied, freed_bytes=freed, ring_bytes=self._h2d_bytes - ring_before,
                           seconds=time.perf_counter() - start)

    def take_step_stats(self, wait: bool = False) -> StepStats:
        """Totals since the previous call (or since attach); emits every resolved StagingEvent.

        Call it at each denoise-step boundary. Copies and bytes count when issued; the stall and the
        staging events count when their timing events have resolved. By default it never blocks: the
        copies issued at the end of a step (the next step's first blocks) are still running on the
        copy stream, and waiting for them here would stop the next step's compute from overlapping
        them. `wait=True` resolves everything (teardown, tests).
        """
        self._absorb(self._clock.drain() if self._cuda and wait else self._clock.poll())
        stats = StepStats(self._stall_s, self._h2d_bytes, self._transfers)
        self._stall_s, self._h2d_bytes, self._transfers = 0.0, 0, 0
        return stats

    # ------------------------------------------------------------------ attach / detach

    def _attach(self) -> None:
        packed = self._blocks if self.keep_masters else self._streamed
        for b in self._blocks:
            unview_buffers(b.module)
            if b.resident and not self.keep_masters:
                if self._weights is not None:
                    self._weights.materialize_module(b.module)
                tensors = unique_tensors(b.module)
                move_preserving_aliases(tensors, self.device)
                b.tensor_bytes = distinct_bytes(tensors)
        if packed:
            self._pack(packed)
        for b in self._blocks:
            if b.resident and self.keep_masters:
                self._make_resident(b)
        self._resident_bytes = sum(b.tensor_bytes for b in self._blocks if b.resident)
        self._build_ring()

    def _pack(self, packed: list[Block]) -> None:
        self._arena = arena_fill.lay_out(packed, self.device, pin=self._pin, weights=self._weights)
        arena_fill.fill(packed, self._arena, self.device, pin=self._pin, weights=self._weights,
                        progress=self._progress)

    def _build_ring(self) -> None:
        """Hooks on the streamed blocks, then their slots, filled (see `_fill_ring`)."""
        if not self._streamed:
            return
        if self._copy_stream is None:
            self._copy_stream = new_stream(self.device)
        for k, b in enumerate(self._streamed):
            pre = b.module.register_forward_pre_hook(self._make_pre_hook(k), with_kwargs=True)
            self._handles.append(pre)
            post = b.module.register_forward_hook(self._make_post_hook(k))
            self._handles.append(post)
        self._fill_ring()

    def _fill_ring(self) -> None:
        """Slots for the streamed blocks (`residency.slots`, never more than them), warm window."""
        largest = self._slot_nbytes()
        nslots = self.residency.slots
        self._slots = [torch.empty(largest, dtype=torch.uint8, device=self.device) for _ in range(nslots)]
        self._slot_owner = [None] * nslots
        self._slot_ready = [None] * nslots
        self._last_slot = None
        self._load(0, 0, sync=True)
        self._fill_window(0)

    def _clear_ring(self) -> None:
        """Wait for every copy, account it, unbind the streamed blocks and free the slots (hooks stay)."""
        synchronize(self.device)
        self._absorb(self._clock.drain() if self._cuda else self._clock.poll())
        for k in range(len(self._streamed)):
            self._unbind(k)
        self._slots, self._slot_owner, self._slot_ready, self._last_slot = [], [], [], None

    def _make_resident(self, b: Block) -> int:
        """Give a packed block its own device copy of its region and bind it there; returns bytes copied."""
        assert self._arena is not None
        n, off = b.region_nbytes, b.region_offset
        buffer = torch.empty(n, dtype=torch.uint8, device=self.device)
        mark = self._clock.start(current_stream(self.device) if self._cuda else None)
        buffer.copy_(self._arena.tensor[off : off + n], non_blocking=self._arena.pinned)
        self._clock.finish(mark, "copy", b.name, n, sync=True,
                           stream=current_stream(self.device) if self._cuda else None)
        b.device_buffer = buffer
        bind_region(b, buffer)
        return n

    def _drop_resident(self, b: Block) -> int:
        """Free a resident block's device copy (its master stays in the arena); returns bytes freed."""
        n = b.device_buffer.numel() if b.device_buffer is not None else 0
        unbind_region(b, self.device)
        b.device_buffer = None
        return n

    def _abort_attach(self) -> None:
        """Undo a failed attach: hooks off, slots freed, arena unregistered; weights kept on host."""
        self._remove_hooks()
        with contextlib.suppress(Exception):
            synchronize(self.device)
        arena = self._arena
        for b in self._blocks:
            if not b.packed and not b.bindings:
                continue
            b.device_buffer = None
            if b.packed and arena is not None and not arena.closed:
                base = b.region_offset
                for x in b.bindings:
                    rebind(
                        x.target,
                        lambda x=x, base=base: typed_view(arena.tensor, base + x.offset, x.dtype, x.shape, x.stride),
                    )
            b.pieces, b.bindings, b.packed, b.slot = [], [], False, None
            b.tensor_bytes = b.region_nbytes = 0
        self._clock.discard()
        self._release_buffers()

    def _release_buffers(self) -> None:
        self._slots, self._slot_owner, self._slot_ready = [], [], []
        self._last_slot = None
        self._copy_stream = None
        if self._arena is not None:
            self._arena.close()

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    # ------------------------------------------------------------------ forward protocol

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
        slot = b.slot
        assert slot is not None
        ready = self._slot_ready[slot]
        if self._cuda and not synced and ready is not None:
            compute = current_stream(self.device)
            mark = self._clock.start(compute)
            compute.wait_event(ready)
            self._clock.finish(mark, "stall", b.name, 0, stream=compute)
        self._last_slot = slot
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
                    StagingEvent(target=m.target, direction="h2d", nbytes=m.nbytes, seconds=m.seconds, sync=m.sync)
                )
