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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .devices import (
    as_device,
    current_stream,
    is_cuda,
    move_preserving_aliases,
    new_stream,
    placeholder,
    rebind,
    storage_bytes,
    storage_key,
    stream_context,
    synchronize,
    unview_buffers,
)
from .events import EventBus, NullBus, StagingEvent
from .pinned import ALIGNMENT, HostArena, align_up, contiguous_stride, is_dense, span_elements, typed_view
from .residency import BlockResidency
from .transfer_timing import Measured, TransferClock

_GROUP_ALIGN = 16  # storage-group starts are rounded down to this so every dtype stays aligned


@dataclass(frozen=True, slots=True)
class StepStats:
    """Transfer totals since the previous `take_step_stats()` call.

    `stall_s`: time compute waited on weight copies (exposed stall). `h2d_bytes` / `transfers`:
    bytes and number of host-to-device block copies issued.
    """

    stall_s: float
    h2d_bytes: int
    transfers: int


@dataclass(slots=True)
class _Binding:
    target: torch.Tensor
    offset: int  # byte offset inside the block region (and inside a slot)
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(slots=True)
class _Piece:
    """Bytes copied into the arena at pack time: a raw storage span, or one tensor's values."""

    offset: int  # inside the block region
    nbytes: int
    source: torch.Tensor
    raw: bool  # True: `source` is a uint8 storage span; False: a tensor copied with its values
    binding: _Binding | None = None


@dataclass(slots=True)
class _Block:
    name: str
    module: torch.nn.Module
    resident: bool
    tensor_bytes: int = 0
    region_offset: int = 0
    region_nbytes: int = 0
    bindings: list[_Binding] = field(default_factory=list)
    pieces: list[_Piece] = field(default_factory=list)
    slot: int | None = None  # slot its tensors currently point into
    packed: bool = False


def _distinct_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the tensors, counting tensors that share one storage once (their union span)."""
    spans: dict[Any, tuple[int, int, int]] = {}
    for t in tensors:
        start = t.storage_offset() * t.element_size()
        end = start + span_elements(t.shape, t.stride()) * t.element_size()
        key = storage_key(t)
        lo, hi, n = spans.get(key, (start, end, 0))
        spans[key] = (min(lo, start), max(hi, end), n + t.numel() * t.element_size())
    return sum(min(hi - lo, n) for lo, hi, n in spans.values())


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    start = t.storage_offset() * t.element_size()
    return start, start + span_elements(t.shape, t.stride()) * t.element_size()


def _clusters(tensors: Sequence[torch.Tensor]) -> list[tuple[list[torch.Tensor], int, int]]:
    """Tensors of one storage grouped into runs of overlapping byte ranges: (tensors, lo, hi)."""
    out: list[tuple[list[torch.Tensor], int, int]] = []
    for t in sorted(tensors, key=lambda t: _byte_range(t)[0]):
        start, end = _byte_range(t)
        if out and start < out[-1][2]:
            members, lo, hi = out[-1]
            out[-1] = ([*members, t], lo, max(hi, end))
        else:
            out.append(([t], start, end))
    return out


def _reject_shared_ranges(claims: list[tuple[Any, int, int, str]]) -> None:
    """Two blocks using overlapping bytes of one storage cannot be streamed independently."""
    by_key: dict[Any, list[tuple[int, int, str]]] = {}
    for key, lo, hi, name in claims:
        by_key.setdefault(key, []).append((lo, hi, name))
    for ranges in by_key.values():
        ranges.sort()
        reach, owner = -1, ""
        for lo, hi, name in ranges:
            if lo < reach and name != owner:
                raise ValueError(f"{name} shares weight storage with {owner}; shared weights cannot be streamed")
            if hi > reach:
                reach, owner = hi, name


def _unique_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


class LayerwiseStreamer:
    """Streams the blocks of one or more block lists (execution order) through its device slots.

    `residency` (one flag per block, in execution order, and the slot count) is the plan's
    decision and is carried out as given. `resident_layers` is shorthand for
    `BlockResidency.leading(num_blocks, resident_layers)` for callers without a plan; give one or
    neither (neither: every block streamed).
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
    ) -> None:
        self.device = as_device(device)
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
        self._blocks = [_Block(name, m, resident=r) for (name, m), r in zip(blocks, residency.resident, strict=True)]
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
        return arena.nbytes if arena is not None and arena.pinned else 0

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
            for t in _unique_tensors(b.module) if b.resident else [x.target for x in b.bindings]:
                rebind(t, lambda t=t: placeholder(t.dtype, self.device))
            b.slot = None
        self._release_buffers()
        self._attached = False
        self._released = True

    def set_slots(self, slots: int) -> None:
        """Change the ring's depth in place (no repacking): the slots are reallocated and refilled.

        Used between requests, when only the prefetch depth changes; the residency keeps its blocks."""
        if not self._attached or not self._streamed:
            raise RuntimeError("set_slots needs an attached streamer with streamed blocks")
        residency = BlockResidency(self.residency.resident, min(slots, len(self._streamed)), self.residency.placement)
        synchronize(self.device)
        self._absorb(self._clock.drain() if self._cuda else self._clock.poll())
        for k in range(len(self._streamed)):
            self._unbind(k)
        self._slots, self._slot_owner, self._slot_ready, self._last_slot = [], [], [], None
        largest = self.largest_block_bytes
        self._slots = [torch.empty(largest, dtype=torch.uint8, device=self.device) for _ in range(residency.slots)]
        self._slot_owner = [None] * residency.slots
        self._slot_ready = [None] * residency.slots
        self.residency = residency
        self._load(0, 0, sync=True)
        self._fill_window(0)

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
        for b in self._blocks:
            unview_buffers(b.module)
            if b.resident:
                tensors = _unique_tensors(b.module)
                move_preserving_aliases(tensors, self.device)
                b.tensor_bytes = _distinct_bytes(tensors)
        self._resident_bytes = sum(b.tensor_bytes for b in self._blocks if b.resident)
        if not self._streamed:
            return
        claims: list[tuple[Any, int, int, str]] = []
        cursor = 0
        for b in self._streamed:
            self._plan_block(b, claims)
            b.region_offset = cursor
            cursor = align_up(cursor + b.region_nbytes)
        _reject_shared_ranges(claims)
        self._arena = HostArena(cursor, pin=False)  # pinned once filled: see HostArena.pin
        total = sum(b.region_nbytes for b in self._streamed)
        done = 0
        for b in self._streamed:
            self._pack_block(b)
            done += b.region_nbytes
            if self._progress is not None:
                self._progress(done, total)
        if self._pin:
            self._arena.pin()
        largest = self.largest_block_bytes
        nslots = self.residency.slots
        self._slots = [torch.empty(largest, dtype=torch.uint8, device=self.device) for _ in range(nslots)]
        self._slot_owner = [None] * nslots
        self._slot_ready = [None] * nslots
        self._copy_stream = new_stream(self.device)
        for k, b in enumerate(self._streamed):
            pre = b.module.register_forward_pre_hook(self._make_pre_hook(k), with_kwargs=True)
            self._handles.append(pre)
            post = b.module.register_forward_hook(self._make_post_hook(k))
            self._handles.append(post)
        self._load(0, 0, sync=True)
        self._fill_window(0)

    def _plan_block(self, b: _Block, claims: list[tuple[Any, int, int, str]]) -> None:
        """Decide where each tensor of the block goes inside its region (no copying yet).

        Tensors are grouped by storage and then into clusters of overlapping byte ranges: a cluster
        (tied views, a buffer viewing a weight) is packed as one span so aliasing survives, while
        unrelated tensors that merely live in one big storage are packed separately. Each cluster's
        range is recorded in `claims` so ranges used by two blocks can be rejected.
        """
        groups: dict[Any, list[torch.Tensor]] = {}
        for t in _unique_tensors(b.module):
            if t.is_meta:
                raise ValueError(f"{b.name}: cannot stream a meta tensor (weights not loaded)")
            if t.numel() == 0:
                rebind(t, lambda t=t: t.detach().to(self.device))
                continue
            groups.setdefault(storage_key(t), []).append(t)
        cursor = 0
        for key, ts in groups.items():
            for cluster, lo, hi in _clusters(ts):
                claims.append((key, lo, hi, b.name))
                cursor = align_up(cursor, ALIGNMENT)
                if len(cluster) == 1 and not is_dense(cluster[0]):
                    t = cluster[0]
                    shape = tuple(t.shape)
                    nbytes = t.numel() * t.element_size()
                    binding = _Binding(t, cursor, t.dtype, shape, contiguous_stride(shape))
                    b.pieces.append(_Piece(cursor, nbytes, t, raw=False, binding=binding))
                    b.bindings.append(binding)
                else:
                    lo = lo // _GROUP_ALIGN * _GROUP_ALIGN
                    nbytes = hi - lo
                    b.pieces.append(_Piece(cursor, nbytes, storage_bytes(cluster[0])[lo:hi], raw=True))
                    for t in cluster:
                        start = t.storage_offset() * t.element_size()
                        shape, stride = tuple(t.shape), tuple(t.stride())
                        b.bindings.append(_Binding(t, cursor + start - lo, t.dtype, shape, stride))
                b.tensor_bytes += nbytes
                cursor += nbytes
        b.region_nbytes = align_up(cursor, ALIGNMENT)

    def _pack_block(self, b: _Block) -> None:
        """Copy the block into its arena region, then drop the original tensors' storage."""
        assert self._arena is not None
        arena = self._arena.tensor
        base = b.region_offset
        for p in b.pieces:
            if p.raw:
                arena[base + p.offset : base + p.offset + p.nbytes].copy_(p.source)
            else:
                x = p.binding
                assert x is not None
                typed_view(arena, base + x.offset, x.dtype, x.shape, x.stride).copy_(p.source)
        b.pieces = []  # release references to the original storage
        b.packed = True
        for x in b.bindings:
            rebind(x.target, lambda x=x: placeholder(x.dtype, self.device))

    def _abort_attach(self) -> None:
        """Undo a failed attach: hooks off, slots freed, arena unregistered; weights kept on host."""
        self._remove_hooks()
        with contextlib.suppress(Exception):
            synchronize(self.device)
        arena = self._arena
        for b in self._streamed:
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
        self._slot_owner[slot] = k
        self._h2d_bytes += n
        self._transfers += 1
        self._bind(k, slot)

    def _bind(self, k: int, slot: int) -> None:
        b = self._streamed[k]
        buf = self._slots[slot]
        for x in b.bindings:
            rebind(x.target, lambda x=x: typed_view(buf, x.offset, x.dtype, x.shape, x.stride))
        b.slot = slot

    def _unbind(self, k: int) -> None:
        b = self._streamed[k]
        for x in b.bindings:
            rebind(x.target, lambda x=x: placeholder(x.dtype, self.device))
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
