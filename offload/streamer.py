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

The ring's forward protocol (the hooks, slots, copies and their accounting) is `BlockRing`
(offload/block_ring.py), or `ByteRing` (offload/byte_ring.py: the slots' bytes as one buffer, for
units of very different sizes) where the residency says `byte_ring`; this module owns the blocks,
the arena, attach/detach and re-plan.

On CPU there is no asynchrony: copies are plain synchronous copies, so all copy time is exposed
stall (a CPU cannot overlap them with compute); the protocol and the bit-exact results are the same.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from . import arena_fill
from .address_phase import device_bytes, place_like
from .block_packing import (
    Block,
    bind_region,
    distinct_bytes,
    unbind_region,
    unique_tensors,
)
from .byte_ring import ByteRing
from .deferred_weights import DeferredWeights
from .devices import (
    as_device,
    current_stream,
    is_cuda,
    move_preserving_aliases,
    new_stream,
    placeholder,
    rebind,
    synchronize,
    unview_buffers,
)
from .events import EventBus, NullBus
from .options import DEFAULT_LOAD, LoadOptions
from .pinned import HostArena, typed_view
from .residency import BlockResidency
from .stream_stats import ReplanStats, StepStats
from .transfer_timing import TransferClock
from .upcast import BlockUpcast


class LayerwiseStreamer(ByteRing):
    """Streams the blocks of one or more block lists (execution order) through its device slots.

    `residency` (one flag per block, in execution order, and the slot count) is the plan's
    decision and is carried out as given. `resident_layers` is shorthand for
    `BlockResidency.leading(num_blocks, resident_layers)` for callers without a plan; give one or
    neither (neither: every block streamed).

    `keep_masters=True` packs every block, resident ones too, into the pinned arena and gives each
    resident block a device copy of its region: the arena then holds the whole DiT (pinned bytes =
    all blocks, not only the streamed ones), and in exchange `replan` can change which blocks are
    resident, where, and the ring's depth between requests by device copies alone.

    `active` (one flag per block; default all) leaves the blocks marked False out of the ring: they are
    *parked*, neither resident nor streamed, their bytes only in the arena (needs `keep_masters`). Two
    experts of which one runs per forward (Wan 2.2 A14B) stream through one ring this way: the idle
    expert's blocks are parked, so the ring cycles through the active expert's blocks alone, and
    `replan(..., active=)` hands the device budget from one expert to the other.
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
        compute_dtype: torch.dtype | None = None,
        active: Sequence[bool] | None = None,
        load_options: LoadOptions = DEFAULT_LOAD,
    ) -> None:
        self.device = as_device(device)
        self._load_options = load_options  # how the arena is laid out, read and page-locked (arena_fill)
        # float8 tensors (fp8 storage) are converted to `compute_dtype` on the device (offload/upcast.py)
        self.compute_dtype = compute_dtype
        self._upcast = BlockUpcast(compute_dtype, self.device) if compute_dtype is not None else None
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
        self.active = self._check_active(active)
        self._streamed = self._ring_blocks()
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
        self._sync_fetches = 0
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
        return sum(1 for b in self._blocks if b.resident)

    @property
    def num_parked(self) -> int:
        """Blocks left out of the ring (`active` False, not resident): only their masters exist."""
        return len(self._blocks) - self.num_resident - len(self._streamed)

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
        self.residency = replace(self.residency, slots=min(slots, len(self._streamed)))
        self._fill_ring()

    def replan(self, residency: BlockResidency, active: Sequence[bool] | None = None) -> ReplanStats:
        """Carry out another residency between requests, from the arena's masters (no disk, no repacking).

        Blocks that become resident get a device copy of their region; blocks that become streamed
        free theirs and join the ring; the ring is rebuilt with the new depth. Needs `keep_masters`.
        `active` parks the blocks it marks False (see the class); default: every block active. Between
        two forwards (an expert switch inside a request) it is as safe as between requests: it waits
        for the device before it frees anything.
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
        pairs = list(zip(self._blocks, residency.resident, strict=True))
        for b, resident in pairs:  # every release before any copy: the peak never holds both sets
            if b.resident and not resident:
                freed += self._drop_resident(b)
                b.resident = False
        for b, resident in pairs:
            if resident and not b.resident:
                b.resident = True
                copied += self._make_resident(b)
        self.active = self._check_active(active)
        self._streamed = self._ring_blocks()
        self.residency = residency
        self._resident_bytes = sum(b.tensor_bytes for b in self._blocks if b.resident)
        ring_before = self._h2d_bytes
        self._build_ring()
        synchronize(self.device)
        return ReplanStats(copied_bytes=copied, freed_bytes=freed, ring_bytes=self._h2d_bytes - ring_before,
                           seconds=time.perf_counter() - start)

    @property
    def block_names(self) -> list[str]:
        """Every block (`LIST.i`, as the block lists were given), in the order the ring runs them."""
        return [b.name for b in self._blocks]

    def reorder(self, names: Sequence[str]) -> BlockResidency:
        """Run the blocks in another order (`names`: every block name once), e.g. the order the model's
        forward really calls them in; returns the residency that results.

        Each block keeps its residency (nothing is moved between device and host, the arena is not
        repacked); only the ring's order changes: hooks and slots are rebuilt and refilled from the new
        first streamed block. Safe between two forwards, also inside a request."""
        by_name = {b.name: b for b in self._blocks}
        if sorted(names) != sorted(by_name) or len(set(names)) != len(names):
            raise ValueError("a new block order must name every block exactly once")
        attached = self._attached
        if attached and self._streamed:
            self._clear_ring()
            self._remove_hooks()
        active = {b.name: a for b, a in zip(self._blocks, self.active, strict=True)}
        self._blocks = [by_name[n] for n in names]
        self.active = tuple(active[n] for n in names)  # a parked block stays parked
        self._streamed = self._ring_blocks()
        self.residency = replace(self.residency, resident=tuple(b.resident for b in self._blocks))
        if attached:
            self._build_ring()
        return self.residency

    def take_step_stats(self, wait: bool = False) -> StepStats:
        """Totals since the previous call (or since attach); emits every resolved StagingEvent.

        Call it at each denoise-step boundary. Copies and bytes count when issued; the stall and the
        staging events count when their timing events have resolved. By default it never blocks: the
        copies issued at the end of a step (the next step's first blocks) are still running on the
        copy stream, and waiting for them here would stop the next step's compute from overlapping
        them. `wait=True` resolves everything (teardown, tests).
        """
        self._absorb(self._clock.drain() if self._cuda and wait else self._clock.poll())
        stats = StepStats(self._stall_s, self._h2d_bytes, self._transfers, self._sync_fetches)
        self._stall_s, self._h2d_bytes, self._transfers, self._sync_fetches = 0.0, 0, 0, 0
        return stats

    # ------------------------------------------------------------------ attach / detach

    def _check_active(self, active: Sequence[bool] | None) -> tuple[bool, ...]:
        flags = tuple(active) if active is not None else (True,) * len(self._blocks)
        if len(flags) != len(self._blocks):
            raise ValueError(f"active covers {len(flags)} blocks, the streamer holds {len(self._blocks)}")
        if not all(flags) and not self.keep_masters:
            raise ValueError("parked blocks (active False) need keep_masters: their only copy is the arena's")
        return flags

    def _ring_blocks(self) -> list[Block]:
        """The blocks the ring cycles through: streamed and active, in execution order."""
        return [b for b, a in zip(self._blocks, self.active, strict=True) if not b.resident and a]

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
                if self._upcast is not None:
                    self._upcast.hold(b.name, b.module)  # resident fp8: upcast before each forward
        if packed:
            self._pack(packed)
        for b in self._blocks:
            if b.resident and self.keep_masters:
                self._make_resident(b)
        self._resident_bytes = sum(b.tensor_bytes for b in self._blocks if b.resident)
        self._build_ring()

    def _pack(self, packed: list[Block]) -> None:
        options = self._load_options
        self._arena = arena_fill.lay_out(packed, self.device, pin=self._pin, weights=self._weights, options=options)
        arena_fill.fill(packed, self._arena, self.device, pin=self._pin, weights=self._weights,
                        progress=self._progress, options=options)

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

    def _make_resident(self, b: Block) -> int:
        """Give a packed block its own device copy of its region and bind it there; returns bytes copied."""
        assert self._arena is not None
        n, off = b.region_nbytes, b.region_offset
        buffer = place_like(device_bytes, n, self.device, 0)  # CPU: on a page, as its region (`plan_block`)
        mark = self._clock.start(current_stream(self.device) if self._cuda else None)
        buffer.copy_(self._arena.tensor[off : off + n], non_blocking=self._arena.pinned)
        self._clock.finish(mark, "copy", b.name, n, sync=True,
                           stream=current_stream(self.device) if self._cuda else None)
        b.device_buffer = buffer
        bind_region(b, buffer)
        if self._upcast is not None:
            self._upcast.hold(b.name, b.module)  # resident fp8: upcast before each forward
        return n

    def _drop_resident(self, b: Block) -> int:
        """Free a resident block's device copy (its master stays in the arena); returns bytes freed."""
        n = b.device_buffer.numel() if b.device_buffer is not None else 0
        if self._upcast is not None:
            self._upcast.drop(b.name)
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
        if self._upcast is not None:
            self._upcast.release()
        self._slots, self._slot_owner, self._slot_ready = [], [], []
        self._last_slot = None
        self._copy_stream = None
        if self._arena is not None:
            self._arena.close()

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

