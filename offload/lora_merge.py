"""Merge on upload: a LoRA's delta added into a streamed block's slot after the block arrives, before it runs.

The ring's fill copies a block's clean bytes from its host master into a slot; fp8 storage is then
upcast into the scratch the block's tensors point at. This hook runs right after that (inside the ring's
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
from typing import Any

from .block_packing import Block
from .upcast import is_float8


class MergeOnUpload:
    """Per streamed block (by name), the functions that merge its LoRA layers into their bound weights."""

    def __init__(self, merges: dict[str, list[Callable[[], None]]]) -> None:
        self.merges = merges
        self._fresh: set[str] = set()  # blocks whose slot holds unmerged bytes
        self.merged_blocks = 0  # merges on arrival in a slot since load (tests, the report)
        self.merged_resident = 0  # merges into a resident block's fresh device copy since load

    def watch(self, ring: Any) -> None:
        """Wrap a new ring's fill and `before` (the streamer calls this for each ring it builds)."""
        fill, before = ring._fill, ring.before
        streamed: list[Block] = ring.streamed

        def filled(b: Block, out: Any, **kwargs: Any) -> Any:
            self._fresh.add(b.name)
            return fill(b, out, **kwargs)

        def ready(k: int) -> None:
            before(k)
            if ring.skipping:  # a step cache passes it: not filled, nothing to merge (its bindings hold no bytes of it)
                return
            b = streamed[k]
            upcast = any(is_float8(x.dtype) for x in b.bindings)
            if b.name in self.merges and (upcast or b.name in self._fresh):
                for merge in self.merges[b.name]:
                    merge()
                self.merged_blocks += 1
            self._fresh.discard(b.name)

        ring._fill = filled
        ring.before = ready
        self._fresh.clear()  # a new ring refills every slot it uses

    def resident(self, b: Block) -> None:
        """A block got a fresh device copy of its master (the streamer calls this, `watch_resident`): merge it once."""
        merges = self.merges.get(b.name)
        if merges:
            for merge in merges:
                merge()
            self.merged_resident += 1
