"""The prefetch ring: k device slots that hold the block that runs and the next k-1 streamed blocks.

`LayerwiseStreamer` (offload/streamer.py) owns the blocks and their lifecycle and composes a ring
with a slot filler (offload/slot_filler.py: where a slot's bytes come from) and a copy ledger
(offload/copy_ledger.py: the accounting). The ring is what runs during a forward: each streamed
block's pre-hook calls `before(k)`, which makes sure its bytes are in a slot (waiting on the slot's
copy event, or copying synchronously when the ring missed it), and its post-hook `after(k)` frees the
slot and refills it at once with the block k slots ahead, on the copy stream, so copies run ahead
of compute, cyclically across steps.

A step cache (diffusers' First-Block Cache, MagCache) can decide that blocks of a forward will not run;
`skip(k)` (set by the streamer from engine/running/cache_follow.py) says so. The ring then never copies
them: its window holds the next blocks that will run, `before(k)` of a skipped block issues nothing, and
`retarget()` (called when the decision is made) refills the window past the skipped range.

A hit step is short (the probe block, then every later block called only to pass its input on), so the ring's
own work per skipped block is what the step costs beyond the resident model's: a skipped block asks the cache
once, is not timed as compute, is not unbound (it holds no slot) and refills nothing unless its answer changed.
The window scans only as far as it must (k blocks that run), over answers remembered until they can change (a
decision, a block that ran), so a forward costs O(blocks), not O(blocks²), in `skip` calls.

`ByteRing` (offload/byte_ring.py) is the same protocol over one byte buffer, for units of very
different sizes; the streamer builds one or the other as the residency says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from .address_phase import device_bytes, place_like
from .block_packing import Block, bind_region, unbind_region
from .copy_ledger import CopyLedger
from .devices import current_stream, is_cuda, synchronize
from .module_hooks import Hooks
from .slot_filler import SlotFiller
from .upcast import BlockUpcast


def block_state(b: Block, ready: Any, cuda: bool) -> str:
    """resident / host / in_flight (its copy's event `ready` not reached yet) / device: one block's state."""
    if b.resident:
        return "resident"
    if b.slot is None:
        return "host"
    if cuda and ready is not None and not ready.query():
        return "in_flight"
    return "device"


class SlotRing:
    """k equal slots, which streamed block each holds, and the window of blocks they should hold."""

    def __init__(self, streamed: list[Block], device: torch.device, filler: SlotFiller, ledger: CopyLedger,
                 upcast: BlockUpcast | None) -> None:
        self.streamed = streamed
        self.device = device
        self.cuda = is_cuda(device)
        self.slots: list[torch.Tensor] = []
        self._owner: list[int | None] = []
        self._ready: list[Any] = []
        self._filler = filler
        self._fill = filler.fill
        self._ledger = ledger
        self._clock = ledger.clock
        self._absorb = ledger.absorb
        self._upcast = upcast
        self._skip: Callable[[int], bool] | None = None  # block k will not run in this forward (a step cache's)
        self._answers: dict[int, bool] = {}  # `skip`'s answers since they last could change (see `_skips`)
        self._settled = True  # the slots hold the window from `_cursor` under `_answers`: a skip refills nothing
        self.skipping = False  # the block whose `before` ran last is one the cache skips (not timed as compute)
        self._cursor = 0  # the next block the ring expects to run: where `retarget` refills from

    @property
    def skip(self) -> Callable[[int], bool] | None:
        """Block k will not run in the current forward (a step cache's decision; None: every block runs)."""
        return self._skip

    @skip.setter
    def skip(self, skip: Callable[[int], bool] | None) -> None:
        self._skip = skip
        self._answers.clear()
        self._settled = False

    def _skips(self, j: int) -> bool:
        """`skip(j)`, asked once until it can change: a decision (`retarget`), or block j itself ran or was passed."""
        answer = self._answers.get(j)
        if answer is None:
            assert self._skip is not None
            answer = self._answers[j] = bool(self._skip(j))
        return answer

    @property
    def num_slots(self) -> int:
        """Device slots allocated now (`residency.slots` while open, 0 otherwise)."""
        return len(self.slots)

    def block_states(self, blocks: list[Block]) -> list[tuple[str, str, int]]:
        """(name, state, bytes) per block; state is resident / device / in_flight / host."""
        ready = self._ready
        return [(b.name, block_state(b, ready[b.slot] if b.slot is not None and b.slot < len(ready) else None,
                                     self.cuda), b.tensor_bytes) for b in blocks]

    def open(self, nslots: int) -> None:
        """Allocate `nslots` slots (never more than the streamed blocks) and warm the window."""
        largest = self._filler.slot_nbytes(self.streamed)
        # on a CPU each slot starts on a page: a block bound there keeps its tensors' phase (`plan_block`)
        self.slots = [place_like(device_bytes, largest, self.device, 0) for _ in range(nslots)]
        self._owner = [None] * nslots
        self._ready = [None] * nslots
        if self._upcast is not None:
            self._upcast.size_for(self.streamed)
        self._answers.clear()
        self._load(0, 0, sync=True)
        self._fill_window(0)

    def close(self) -> None:
        """Wait for every copy, account it, unbind the streamed blocks and free the slots (hooks stay)."""
        synchronize(self.device)
        self._ledger.settle()
        for k in range(len(self.streamed)):
            self._unbind(k)
        self.slots, self._owner, self._ready = [], [], []

    def before(self, k: int) -> None:
        """Block k is about to run: its bytes are in a slot and the compute stream waits for their copy."""
        b = self.streamed[k]
        self._cursor = k
        self.skipping = False
        if self._skip is not None:
            skipped = bool(self._skip(k))  # asked afresh: a block that runs always finds its bytes
            if self._answers.get(k) is not skipped:  # not asked yet, or the window was built on another answer
                self._settled = False
            self._answers[k] = skipped
            if skipped:  # the cache skips it: its bytes never cross the link
                self.skipping = True
                self._ledger.skipped(b.name, b.region_nbytes)
                if not self._settled:
                    self._fill_window(k)
                return
            self._ledger.end_skips()
        if self.cuda:
            self._absorb(self._clock.poll())
        synced = False
        if b.slot is None or self._owner[b.slot] != k:
            held = self._slot_of(k)
            if held is not None:
                self._bind(k, held)  # its bytes are still in a slot: no copy needed
            else:
                self._load(k, self._free_slot(k), sync=True)
                synced = True
                self._ledger.sync_fetches += 1  # the ring missed: compute waits for the whole copy
        slot = b.slot
        assert slot is not None
        ready = self._ready[slot]
        if self.cuda and not synced and ready is not None:
            compute = current_stream(self.device)
            mark = self._clock.start(compute)
            compute.wait_event(ready)
            self._clock.finish(mark, "stall", b.name, 0, stream=compute)
        if self._upcast is not None:  # fp8 storage: convert on the compute stream, after the copy's wait
            self._upcast.run(b, self.slots[slot])
        self._fill_window(k)  # normally a no-op: the post-hooks keep the window full

    def after(self, k: int) -> None:
        """Free block k's slot and refill it at once with the block k slots ahead.

        Issuing that copy here rather than at a later pre-hook changes nothing inside a forward,
        but at the end of one it starts the next step's first copies while the tail modules, the
        scheduler step, the next forward's embeddings and any resident prefix run — the link would
        otherwise idle there once per step.
        """
        self._cursor = (k + 1) % len(self.streamed)
        if self.skipping:  # passed, not run: its slot (if a guess filled one) and the window stay as they are
            self.skipping = False
            self._answers.pop(k, None)  # its hook has moved on: its next call may be decided otherwise
            if self._skip is not None and self._skips(k) is False:
                self._settled = False
            if not self._settled and len(self.streamed) > len(self.slots):
                self._fill_window(self._cursor)
            return
        self._answers.pop(k, None)
        if len(self.streamed) > len(self.slots):
            self._unbind(k)
            self._fill_window(self._cursor)

    def retarget(self) -> None:
        """A step cache has just decided which blocks run: refill the window from the next block that will."""
        self._answers.clear()
        self._settled = False
        if self.slots:
            self._fill_window(self._cursor)

    def _window(self, base: int) -> list[int]:
        """The streamed blocks the ring should hold from `base` on: base and the next k-1 (cyclic), leaving
        out the blocks a step cache skips (`skip`)."""
        n, want = len(self.streamed), len(self.slots)
        if self._skip is None:
            return [(base + d) % n for d in range(min(want, n))]
        window: list[int] = []
        for d in range(n):  # only as far as k blocks that run
            j = (base + d) % n
            if not self._skips(j):
                window.append(j)
                if len(window) == want:
                    break
        return window

    def _slot_of(self, k: int) -> int | None:
        return next((s for s, owner in enumerate(self._owner) if owner == k), None)

    def _free_slot(self, base: int) -> int:
        """A slot whose block the window from `base` does not need: an empty one first, else the one
        whose block ran longest ago."""
        window = self._window(base)
        n = len(self.streamed)
        candidates = [s for s, owner in enumerate(self._owner) if owner not in window]
        return max(candidates, key=lambda s: n if self._owner[s] is None else (base - self._owner[s]) % n)

    def _fill_window(self, base: int) -> None:
        """Issue async copies, in execution order, for the window's blocks that no slot holds yet."""
        self._settled = True
        if len(self.slots) < 2:
            return
        for j in self._window(base):
            if self._slot_of(j) is None:
                self._load(j, self._free_slot(base), sync=False)

    def _load(self, k: int, slot: int, *, sync: bool) -> None:
        """Fill `slot` with block k's region and point its tensors there."""
        b = self.streamed[k]
        prev = self._owner[slot]
        if prev is not None and prev != k and self.streamed[prev].slot == slot:
            self._unbind(prev)
        self._owner[slot] = None
        n, self._ready[slot] = self._fill(b, self.slots[slot], sync=sync, previous=self._ready[slot])
        self._owner[slot] = k
        ledger = self._ledger
        ledger.h2d_bytes += n
        ledger.transfers += 1
        self._bind(k, slot)

    def _bind(self, k: int, slot: int) -> None:
        b = self.streamed[k]
        bind_region(b, self.slots[slot])
        b.slot = slot

    def _unbind(self, k: int) -> None:
        b = self.streamed[k]
        if b.slot is None:  # bound nowhere: its tensors are placeholders already
            return
        unbind_region(b, self.device)
        b.slot = None


class Ring(Protocol):
    """What the streamer drives: `SlotRing`, or `ByteRing` (offload/byte_ring.py)."""

    slots: list[torch.Tensor]
    skip: Callable[[int], bool] | None
    skipping: bool  # the block whose `before` ran last will not run (a step cache skips it)

    @property
    def num_slots(self) -> int: ...
    def retarget(self) -> None: ...
    def open(self, nslots: int) -> None: ...
    def close(self) -> None: ...
    def before(self, k: int) -> None: ...
    def after(self, k: int) -> None: ...
    def block_states(self, blocks: list[Block]) -> list[tuple[str, str, int]]: ...


def ring_hooks(hooks: Hooks, module: torch.nn.Module, ring: Ring, k: int, ledger: CopyLedger | None = None,
               name: str = "", device: torch.device | None = None) -> None:
    """Block k's pre-hook (`ring.before(k)`) and post-hook (`ring.after(k)`): one call each, no more.
    With a `ledger`, the block's forward between them is timed on the compute stream (a trace's compute track);
    a block the step cache skips is not (it computes nothing: two timing events for it would only cost time)."""
    before, after = ring.before, ring.after
    if ledger is None or device is None:
        @torch.compiler.disable
        def pre_hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            before(k)

        @torch.compiler.disable
        def post_hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            after(k)
    else:
        mark: list[Any] = [None]

        @torch.compiler.disable
        def pre_hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            before(k)
            if not ring.skipping:
                mark[0] = ledger.compute_started(current_stream(device))

        @torch.compiler.disable
        def post_hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if mark[0] is not None:
                ledger.compute_done(mark[0], name, current_stream(device))
                mark[0] = None
            after(k)

    hooks.before(module, pre_hook, with_kwargs=True)
    hooks.after(module, post_hook)
