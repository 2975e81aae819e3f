"""Check the DiT block order the plan assumed against the first real forward, and adopt what ran.

The plan orders a DiT's block lists as its class's `__init__` registers them (engine/model_dir/blocks.py). That
is a guess: Lumina2 registers `noise_refiner` before `context_refiner` but runs `context_refiner`
first, so a ring built in registration order misses every block of both refiners (a synchronous
fetch each, every step) and moves twice the bytes the plan predicts. `BlockOrderWatch` records the
order the blocks are called in during each DiT's first forward of a load and hands it to the engine,
which reorders the streamer, re-plans and caches the order (engine/model_dir/order_cache.py).

Only an order that is one pass over the block lists (each list's blocks together, in index order)
can be a plan's order. Lists interleaved block by block, every block called once (Latte: spatial
block i, then temporal block i), are followed by the streamer alone, block by block, while the plan
keeps its lists (same blocks, same bytes per forward); not cached, so each load's first forward
finds it again. Anything else (a block called twice, a block skipped) is reported and the plan's
order kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from ...offload.events import Event, LogEvent
from ...offload.module_hooks import Hooks
from ...offload.streamer import LayerwiseStreamer
from ..events import BlockOrderCorrected
from ..model_dir.blocks import BlockList
from ..model_dir.discovery import ModelInfo
from ..model_dir.order_cache import save_observed_order
from ..planning.lora_cost import with_lora
from ..planning.plan import Plan, make_plan
from ..planning.request_profile import RequestProfile

Observed = Callable[[str, list[tuple[str, int]]], None]


def one_pass_order(calls: Sequence[tuple[str, int]], lists: Sequence[BlockList]) -> list[str] | None:
    """The block lists' order when `calls` runs each list's blocks once, together and in index order; else None."""
    order: list[str] = []
    for attr, _ in calls:
        if not order or order[-1] != attr:
            order.append(attr)
    counts = {b.attr: b.count for b in lists}
    if sorted(order) != sorted(counts) or len(set(order)) != len(order):
        return None
    expected = [(attr, i) for attr in order for i in range(counts[attr])]
    return order if list(calls) == expected else None


class BlockOrderWatch:
    """Records the order each DiT's blocks are called in during that DiT's first (completed) forward.

    `on_observed(dit, calls)` gets the calls ((list, index) in call order) once per DiT, from the DiT's
    forward post-hook (between two forwards: the streamer may be rebuilt there). A forward that raises
    leaves the DiT watched; the next one is recorded afresh. `close()` removes every hook."""

    def __init__(self, dits: dict[str, torch.nn.Module], lists: dict[str, Sequence[BlockList]],
                 on_observed: Observed) -> None:
        self._on_observed = on_observed
        self._hooks: dict[str, Hooks] = {}
        for name, module in dits.items():
            if name in lists and lists[name]:
                self._watch(name, module, lists[name])

    @property
    def watching(self) -> list[str]:
        """DiTs whose first forward has not completed yet."""
        return list(self._hooks)

    def _watch(self, name: str, module: torch.nn.Module, lists: Sequence[BlockList]) -> None:
        calls: list[tuple[str, int]] = []
        active = [False]

        def start(*_: Any, **__: Any) -> None:
            calls.clear()
            active[0] = True

        def finish(*_: Any, **__: Any) -> None:
            active[0] = False
            self._unwatch(name)
            self._on_observed(name, list(calls))

        hooks = Hooks()
        hooks.before(module, start, with_kwargs=True)
        hooks.after(module, finish, with_kwargs=True)
        for block_list in lists:
            for index, block in enumerate(getattr(module, block_list.attr)):
                def record(*_: Any, attr: str = block_list.attr, index: int = index, **__: Any) -> None:
                    if active[0]:
                        calls.append((attr, index))
                hooks.before(block, record, with_kwargs=True)
        self._hooks[name] = hooks

    def _unwatch(self, name: str) -> None:
        hooks = self._hooks.pop(name, None)
        if hooks is not None:
            hooks.remove()

    def close(self) -> None:
        for name in list(self._hooks):
            self._unwatch(name)


def every_block_once(calls: Sequence[tuple[str, int]], lists: Sequence[BlockList]) -> bool:
    """Whether `calls` runs every block of `lists` exactly once (in any order)."""
    expected = {(b.attr, i) for b in lists for i in range(b.count)}
    return len(calls) == len(expected) and set(calls) == expected


def reordered_names(names: Sequence[str], dit: str, order: Sequence[str]) -> list[str]:
    """The streamer's block names (`DIT.LIST.i`) with `dit`'s blocks put in `order` (lists), the rest kept."""
    def key(name: str) -> tuple[int, int]:
        _, attr, index = name.split(".")
        return order.index(attr), int(index)

    mine = iter(sorted((n for n in names if n.split(".", 1)[0] == dit), key=key))
    return [next(mine) if n.split(".", 1)[0] == dit else n for n in names]


def permute_profile(profile: RequestProfile, measured: Plan, now: Plan) -> RequestProfile:
    """A profile whose per-block compute was measured in `measured`'s block order, in `now`'s order."""
    where = {(b.dit, b.attr, b.index): i for i, b in enumerate(measured.blocks)}
    compute = profile.block_compute_s
    if len(compute) != len(measured.blocks) or len(now.blocks) != len(measured.blocks):
        return profile
    try:
        permuted = [compute[where[(b.dit, b.attr, b.index)]] for b in now.blocks]
    except KeyError:
        return profile
    return profile.model_copy(update={"block_compute_s": permuted})


def adopt_order(model: ModelInfo, plan: Plan, streamer: LayerwiseStreamer | None, dit: str,
                calls: list[tuple[str, int]]) -> tuple[ModelInfo, Plan, list[Event]]:
    """What a DiT's first forward (`calls`) means for the load: (model, plan, events to publish).

    One pass over the block lists is cached and marks the model's order as observed; when it differs
    from the plan's, the streamer runs the blocks in that order (each keeps its residency), the plan is
    remade from the corrected model with the streamer's residency, and it is said (an event and a log
    line). Anything else keeps the plan's order, with a warning."""
    info = model.component(dit)
    planned = [b.attr for b in info.block_lists]
    observed = one_pass_order(calls, info.block_lists)
    if observed is None and every_block_once(calls, info.block_lists):
        if streamer is None:
            return model, plan, []
        mine = iter(f"{dit}.{attr}.{index}" for attr, index in calls)
        streamer.reorder([next(mine) if n.split(".", 1)[0] == dit else n for n in streamer.block_names])
        return model, plan, [LogEvent(level="info", message=(
            f"{dit}: its first forward interleaves its block lists ({' and '.join(planned)}, block by block); "
            "the streamer now runs the blocks in that order, the plan keeps its lists' order"))]
    if observed is None:
        return model, plan, [LogEvent(level="warning", message=(
            f"{dit}: its first forward did not run each block list once, in order ({len(calls)} block calls); "
            f"the plan's order is kept ({' → '.join(planned)})"))]
    events: list[Event] = []
    try:
        save_observed_order(model.path, dit, info.class_name, info.block_lists, observed)
    except OSError as exc:
        events.append(LogEvent(level="warning", message=f"block order not cached: {exc}"))
    by_attr = {b.attr: b for b in info.block_lists}
    corrected = replace(info, block_lists=tuple(by_attr[a] for a in observed), order_observed=True)
    model = replace(model, components=tuple(corrected if c.name == dit else c for c in model.components))
    if observed == planned:
        return model, replace(plan, model=model), events
    residency = streamer.reorder(reordered_names(streamer.block_names, dit, observed)) if streamer else None
    summary = (f"{dit}: the first forward ran {' → '.join(observed)}, not the order read from "
               f"{info.class_name}'s source ({' → '.join(planned)}); the streamer, the plan and the "
               "profile now follow the observed order")
    events += [BlockOrderCorrected(dit=dit, planned=tuple(planned), observed=tuple(observed), summary=summary),
               LogEvent(level="warning", message=summary)]
    return model, with_lora(make_plan(model, plan.policy, residency), plan.lora_device_bytes), events
