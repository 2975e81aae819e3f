"""Merge on upload: a LoRA's delta added into a streamed block's slot after the block arrives, before it runs.

The ring's fill copies a block's clean bytes from its host master into a slot; fp8 storage is then
upcast into the scratch the block's tensors point at, each LoRA'd weight taking its delta in that same pass
(`BlockUpcast.addends`, offload/upcast_add.py). This hook runs right after that (inside the ring's
`before(k)`, so after the copy's wait and the upcast; a block a step cache skips is not merged, as it is
not filled) and calls the block's merge functions (the engine's:
PEFT's `merge`, as `fuse_lora` calls it), once per arrival: a block that stays in its slot between two
forwards is not merged twice, and a block upcast from fp8 is merged after every upcast (each one
rewrites the scratch). The host masters are never written, so nothing has to be restored on the host.

A resident block of a streamer that keeps masters (two experts, live re-plan) is merged the same way each time
it gets a fresh device copy of its master (`resident`: an expert switch makes the other expert's blocks
resident; the switch back copies the first's again); it is unmerged by another fresh copy
(`LayerwiseStreamer.refresh_resident`) when the LoRA changes, or by being freed when a switch moves it off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .block_packing import Block
from .upcast import is_float8


@dataclass(frozen=True)
class LayerMerge:
    """One LoRA layer's merge: `merge` adds its delta into its weight as bound now. A weight stored in fp8 can
    instead take `delta()` as it is upcast (offload/upcast_add.py: one pass, the same bits); `merged` then only
    marks the layer merged. `weight` None: never fused (several adapters on the layer, PEFT's own merge)."""

    merge: Callable[[], None]
    weight: torch.Tensor | None = None
    delta: Callable[[], torch.Tensor] | None = None
    merged: Callable[[], None] | None = None


class MergeOnUpload:
    """Per streamed block (by name), the merges of its LoRA layers into their bound weights."""

    def __init__(self, merges: dict[str, list[LayerMerge]]) -> None:
        self.merges = merges  # also derives each block's fp8 addends (the setter below)
        self._fresh: set[str] = set()  # blocks whose slot holds unmerged bytes
        self.merged_blocks = 0  # merges on arrival in a slot since load (tests, the report)
        self.merged_resident = 0  # merges into a resident block's fresh device copy since load
        self.fused_layers = 0  # layers merged by their fp8 upcast since load (tests, the benchmark)

    @property
    def merges(self) -> dict[str, list[LayerMerge]]:
        return self._merges

    @merges.setter
    def merges(self, merges: dict[str, list[LayerMerge]]) -> None:
        """The engine sets a new LoRA's merges here; each block's addends for a fused upcast are built once now,
        not on each arrival."""
        self._merges = merges
        self._addends = {name: {id(m.weight): m.delta for m in layers if m.weight is not None and m.delta}
                         for name, layers in merges.items()}

    def watch(self, ring: Any) -> None:
        """Wrap a new ring's fill and `before` (the streamer calls this for each ring it builds)."""
        fill, before = ring._fill, ring.before
        streamed: list[Block] = ring.streamed

        def filled(b: Block, out: Any, **kwargs: Any) -> Any:
            self._fresh.add(b.name)
            return fill(b, out, **kwargs)

        def ready(k: int) -> None:
            b = streamed[k]
            layers = self.merges.get(b.name)
            upcaster = ring._upcast
            if upcaster is not None and layers:  # fp8 storage: each delta added as its weight is upcast
                upcaster.addends = self._addends[b.name]
            try:
                before(k)
            finally:
                if upcaster is not None:
                    upcaster.addends = None
            if ring.skipping:  # a step cache passes it: not filled, nothing to merge (its bindings hold no bytes of it)
                return
            upcast = any(is_float8(x.dtype) for x in b.bindings)
            if layers and (upcast or b.name in self._fresh):
                fused = upcaster.fused if upcaster is not None and upcast else set()
                for m in layers:
                    if m.weight is not None and m.merged is not None and id(m.weight) in fused:
                        m.merged()
                        self.fused_layers += 1
                    else:
                        m.merge()
                self.merged_blocks += 1
            self._fresh.discard(b.name)

        ring._fill = filled
        ring.before = ready
        self._fresh.clear()  # a new ring refills every slot it uses

    def resident(self, b: Block) -> None:
        """A block got a fresh device copy of its master (the streamer calls this, `watch_resident`): merge it once."""
        layers = self.merges.get(b.name)
        if layers:
            for m in layers:
                m.merge()
            self.merged_resident += 1
