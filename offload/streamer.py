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

Swapping never replaces modules or Parameters: each tensor's storage is re-pointed (`param.data = view
into a slot`) and, after the block ran, to a zero-element placeholder. fp8 blocks: offload/upcast.py.

Composed of: a ring that runs during a forward (`SlotRing`, offload/slot_ring.py; or `ByteRing`,
offload/byte_ring.py, one buffer for units of very different sizes, where the residency says
`byte_ring`), a slot filler that owns the host arena and moves a block's bytes into a slot
(`HostCopyFiller`, offload/slot_filler.py; `AllGatherFiller` on an AllGather rank), and a copy
ledger (offload/copy_ledger.py). This module owns the blocks, attach/detach, the ring and reorder; re-plans
between requests (which blocks are resident, from the kept masters) are offload/streamer_replan.py's.

On CPU there is no asynchrony: copies are plain synchronous copies, so all copy time is exposed
stall (a CPU cannot overlap them with compute); the protocol and the bit-exact results are the same.
Its figures (counts and bytes) are offload/streamer_figures.py's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from .block_packing import Block, unique_tensors
from .byte_ring import ByteRing
from .copy_ledger import CopyLedger
from .deferred_weights import DeferredWeights
from .devices import as_device, is_cuda, placeholder, rebind, synchronize, unview_buffers
from .events import EventBus, LogEvent, NullBus
from .module_hooks import Hooks
from .options import DEFAULT_LOAD, LoadOptions
from .residency import BlockResidency
from .resident_blocks import move_resident, restore_to_arena
from .slot_filler import HostCopyFiller, SlotFiller
from .slot_ring import Ring, SlotRing, ring_hooks
from .stream_stats import StepStats
from .streamer_figures import StreamerFigures
from .streamer_replan import StreamerReplan
from .tier_filler import TieredFiller
from .tiers import Tier
from .upcast import BlockUpcast


class LayerwiseStreamer(StreamerReplan, StreamerFigures):
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
        tiers: Sequence[Tier] = (),
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
        if self._upcast is not None:  # resident blocks kept upcast (converted once)
            self._upcast.keep(self._blocks, residency.upcast_flags)
        self.active = self._check_active(active)
        self._streamed = self._ring_blocks()
        self._bus = bus or NullBus()
        self._pin = pin and (self._cuda or load_options.page_locker is not None)
        self._progress = progress
        self._attached = False
        self._released = False
        self._ledger = CopyLedger(self._cuda, self._bus)  # copies since attach, published as staging events
        self.filler: SlotFiller = self._filler_for(tuple(tiers), load_options)
        self.ring: Ring | None = None  # built over the streamed blocks (`_build_ring`)
        self._hooks = Hooks()
        self._resident_bytes = 0
        self._skips: Callable[[torch.nn.Module], bool] | None = None  # a step cache's skip decision (`follow_skips`)
        self._ring_watchers: list[Callable[[Ring], None]] = []  # e.g. LoRA merge on upload (offload/lora_merge.py)
        self._resident_watchers: list[Callable[[Block], None]] = []  # the same, for a block given a device copy

    def _filler_for(self, tiers: tuple[Tier, ...], load_options: LoadOptions) -> SlotFiller:
        """`HostCopyFiller` when every block is pinned; else a `TieredFiller` that reads the page-cache and
        disk blocks from their files (offload/tier_filler.py). `tiers`: one per block, execution order
        (a resident block's is not used); empty: all pinned."""
        if tiers and len(tiers) != len(self._blocks):
            raise ValueError(f"tiers cover {len(tiers)} blocks, the block lists hold {len(self._blocks)}")
        # with masters (two experts, live re-plan) a resident block's tier is where its master lives:
        # `_make_resident` reads it from there
        named = {b.name: t for b, t in zip(self._blocks, tiers, strict=False)
                 if t != "pinned" and (self.keep_masters or not b.resident)}
        # blocks read from their files can go to the page cache if the host refuses to page-lock them
        falls_back = self._pin and self._weights is not None and all(self.active)
        if not named and not falls_back:
            return HostCopyFiller(self.device, self._ledger, load_options)
        for name, tier in named.items():
            self._ledger.tiers[name] = tier
        return TieredFiller(self.device, self._ledger, named, load_options,
                            log=lambda line: self._bus.publish(LogEvent(level="info", message=line)),
                            keep_open=not all(self.active))

    # ------------------------------------------------------------------ public API

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
        self._ledger.settle()
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
        """Change the ring's depth in place (no repacking; between requests): slots reallocated, refilled."""
        if not self._attached or not self._streamed:
            raise RuntimeError("set_slots needs an attached streamer with streamed blocks")
        self._clear_ring()
        self.residency = replace(self.residency, slots=min(slots, len(self._streamed)))
        assert self.ring is not None
        self.ring.open(self.residency.slots)

    def _clear_ring(self) -> None:
        """Wait for every copy, account it, unbind the streamed blocks and free the slots (hooks stay)."""
        if self.ring is not None:
            self.ring.close()

    def region_bytes(self, names: Sequence[str]) -> int:
        """Bytes of the named blocks' packed regions."""
        wanted = set(names)
        return sum(b.region_nbytes for b in self._blocks if b.name in wanted)

    @property
    def queued_reads(self) -> list[str]:
        """Blocks whose file reads are queued or done, waiting for their copy (none without file tiers)."""
        return self.filler.queued if isinstance(self.filler, TieredFiller) else []

    @property
    def streamed_blocks(self) -> list[Block]:
        """The blocks the ring cycles through, in its order."""
        return list(self._streamed)

    def streamed_bindings(self) -> list:
        """Every tensor binding of the streamed blocks (its target, stored dtype and true shape)."""
        return [x for b in self._streamed for x in b.bindings]

    def watch_ring(self, watch: Callable[[Ring], None]) -> None:
        """Call `watch` on every ring built from now on (before its hooks and first fills), and rebuild the
        current one so that it sees it too (between requests)."""
        self._ring_watchers.append(watch)
        if self._attached and self._streamed:
            self._clear_ring()
            self._remove_hooks()
            self._build_ring()

    @property
    def blocks(self) -> list[Block]:
        """Every block (resident, streamed and parked), in the order the ring runs them."""
        return list(self._blocks)

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
        kept = self._upcast.kept if self._upcast else ()  # each block keeps its upcast too
        self.residency = replace(self.residency, resident=tuple(b.resident for b in self._blocks),
                                 upcast=tuple(b.name in kept for b in self._blocks))
        if attached:
            self._build_ring()
        return self.residency

    def follow_skips(self, skips: Callable[[torch.nn.Module], bool] | None) -> Callable[[], None]:
        """Let a step cache's decision drive the ring: `skips(module)` is True when that block will not run in
        the current forward (engine/running/cache_follow.py). Returns `retarget`, to call once the decision is made.
        None stops following. Kept across re-plans and reorders (each ring is built with it)."""
        self._skips = skips
        self._apply_skips()
        return self._retarget

    def _retarget(self) -> None:
        if self.ring is not None:
            self.ring.retarget()

    def _apply_skips(self) -> None:
        if self.ring is None:
            return
        skips, streamed = self._skips, self._streamed
        self.ring.skip = None if skips is None else (lambda k: skips(streamed[k].module))

    def take_step_stats(self, wait: bool = False) -> StepStats:
        """Totals since the previous call (or since attach); emits every resolved StagingEvent.

        Call it at each denoise-step boundary. Copies and bytes count when issued; the stall and the
        staging events count when their timing events have resolved. By default it never blocks: the
        copies issued at the end of a step (the next step's first blocks) are still running on the
        copy stream, and waiting for them here would stop the next step's compute from overlapping
        them. `wait=True` resolves everything (teardown, tests).
        """
        return self._ledger.take(wait)

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
            unview_buffers(b.module, self._weights.replace if self._weights is not None else None)
            if b.resident and not self.keep_masters:
                b.tensor_bytes = move_resident(b, self._weights, self.device)
                if self._upcast is not None:
                    self._upcast.hold(b)  # resident fp8: upcast before each forward (or once, if kept upcast)
        if packed:
            self.filler.pack(packed, pin=self._pin, weights=self._weights, progress=self._progress)
        if isinstance(self.filler, TieredFiller) and self.keep_masters and (
                self.filler.keep_open or self.filler.streams_files(self._streamed)):
            # file-tier resident blocks: read ahead in the bounce ring the ring needs anyway (else one at a time)
            self.filler.read_next([b.name for b in self._blocks if b.resident])
        for b in self._blocks:
            if b.resident and self.keep_masters:
                self._make_resident(b)
        self._resident_bytes = sum(b.tensor_bytes for b in self._blocks if b.resident)
        self._build_ring()

    def _build_ring(self) -> None:
        """A ring over the streamed blocks (bytes or k slots, as the residency says), its hooks on them,
        its slots allocated and its window warmed."""
        if not self._streamed:
            self.ring = None
            return
        self.filler.open()
        if isinstance(self.filler, TieredFiller):
            self.filler.order(self._streamed)  # reads run ahead in the ring's order
        kind = ByteRing if self.residency.byte_ring else SlotRing
        self.ring = kind(self._streamed, self.device, self.filler, self._ledger, self._upcast)
        for watch in self._ring_watchers:
            watch(self.ring)
        for k, b in enumerate(self._streamed):
            ring_hooks(self._hooks, b.module, self.ring, k, self._ledger, b.name, self.device)
        self.ring.open(self.residency.slots)
        self._apply_skips()

    def _abort_attach(self) -> None:
        """Undo a failed attach: hooks off, slots freed, arena unregistered; weights kept on host."""
        self._remove_hooks()
        with contextlib.suppress(Exception):
            synchronize(self.device)
        restore_to_arena(self._blocks, self.filler.arena)
        self._ledger.clock.discard()
        self._release_buffers()

    def _release_buffers(self) -> None:
        if self._upcast is not None:
            self._upcast.release()
        if self.ring is not None:
            self.ring.slots = []
        self.ring = None
        self.filler.release()

    def _remove_hooks(self) -> None:
        self._hooks.remove()

