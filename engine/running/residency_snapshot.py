"""Where each loaded component's weights are now, published as `ResidencySnapshot` events.

State leaves the engine only as events: the rows are read here, on the engine's (worker) thread,
from the placement — stagers' `loaded` flags, the streamer's `block_states()` (which queries CUDA
events), the expert switch — and the console's residency panel shows the latest snapshot's rows.
`ResidencyWatch` publishes when they change: after the load, each stager load/offload, a live
re-plan, an expert switch, each DiT forward (at most one per step per DiT; unchanged rows are not
published again), and an empty snapshot on unload.

With two experts (Wan 2.2 A14B) the idle expert's blocks are parked: out of the ring, only their
pinned masters kept. They are not "host" blocks waiting for their turn in this forward, so they
show as one `idle_expert` row per idle expert that names the running one.
"""

from __future__ import annotations

from itertools import groupby
from typing import TYPE_CHECKING, Any

from ...offload.module_hooks import Hooks
from ..events import ResidencySnapshot

if TYPE_CHECKING:
    from ..engine import Engine

Row = tuple[str, str, int]
IDLE_EXPERT = "idle_expert"
"""The state of a parked expert's blocks (the console shows it as "idle expert")."""
AGGREGATE_ABOVE = 8
"""Block lists longer than this show runs of same-state blocks instead of one row per block."""


def block_rows(states: list[Row], aggregate_above: int = AGGREGATE_ABOVE) -> list[Row]:
    """Per block, or per run of same-state blocks (`transformer.blocks 3–18`) for long lists."""
    rows: list[Row] = []
    for list_name, group in groupby(states, key=lambda s: s[0].rsplit(".", 1)[0]):
        blocks = list(group)
        if len(blocks) <= aggregate_above:
            rows.extend(blocks)
            continue
        index = 0
        for state, run in groupby(blocks, key=lambda s: s[1]):
            run = list(run)
            first, last = index, index + len(run) - 1
            index += len(run)
            span = str(first) if first == last else f"{first}–{last}"
            rows.append((f"{list_name} {span}", state, sum(b[2] for b in run)))
    return rows


def residency_rows(placement: Any, plan: Any, aggregate_above: int = AGGREGATE_ABOVE) -> list[Row] | None:
    """Rows for every weighted component of the loaded plan; None when nothing is placed."""
    if placement is None or plan is None:
        return None
    rows: list[Row] = []
    for c in plan.components:
        name = c.info.name
        if c.residency == "resident":
            rows.append((name, "resident", c.info.nbytes))
        elif c.residency == "staged":
            stager = placement.stagers.get(name)
            loaded = stager is not None and stager.loaded
            rows.append((name, "device" if loaded else "host", stager.staged_bytes if stager else c.info.nbytes))
        elif c.residency == "streamed":
            rows.append((f"{name} (non-block modules)", "resident", c.info.non_block_bytes))
    streamer = placement.streamer
    if streamer is not None:
        rows.extend(_streamed_rows(streamer, getattr(placement, "experts", None), aggregate_above))
    return rows


def _streamed_rows(streamer: Any, switch: Any, aggregate_above: int) -> list[Row]:
    """The streamer's block rows; with two experts the parked (idle) expert's blocks as one row each."""
    states = streamer.block_states()
    if switch is None:
        return block_rows(states, aggregate_above)
    active = list(streamer.active)
    running = switch.experts[switch.active].name
    rows = block_rows([s for s, a in zip(states, active, strict=True) if a], aggregate_above)
    for expert in switch.experts:
        parked = [s for s, a in zip(states, active, strict=True)
                  if not a and s[0].split(".", 1)[0] == expert.name]
        if parked:
            rows.append((f"{expert.name} blocks ({len(parked)}; {running} running)", IDLE_EXPERT,
                         sum(s[2] for s in parked)))
    return rows


class ResidencyWatch:
    """Publishes the engine's residency rows on its bus whenever they change (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._last: tuple[Row, ...] = ()  # nothing loaded yet: nothing to say on a failed load's release
        self._hooks = Hooks()

    def publish(self) -> None:
        """A snapshot of the rows now, unless they are the ones last published."""
        rows = residency_rows(self.engine.placement, self.engine.plan)
        snapshot = tuple(rows) if rows is not None else ()
        if snapshot != self._last:
            self._last = snapshot
            self.engine.bus.publish(ResidencySnapshot(rows=snapshot))

    def attach(self) -> None:
        """After a load: follow the stagers and the expert switch (as their listener) and the DiTs' forwards
        (a post-hook); publish the first rows."""
        self.detach(publish=False)
        placement, engine = self.engine.placement, self.engine
        if placement is None:
            return
        hooks = self._hooks
        for stager in placement.stagers.values():
            hooks.add(stager.changed.add(self.publish))
        if getattr(placement, "experts", None) is not None:
            hooks.add(placement.experts.changed.add(self.publish))
        for d in engine.model.denoisers:
            module = getattr(engine.pipe, d.name, None)
            if module is not None and hasattr(module, "register_forward_hook"):
                hooks.after(module, lambda *_: self.publish())
        self.publish()

    def detach(self, *, publish: bool = True) -> None:
        """Before a release: stop following it; `publish`: say nothing is loaded (an empty snapshot)."""
        self._hooks.remove()
        if publish and self._last != ():
            self._last = ()
            self.engine.bus.publish(ResidencySnapshot(rows=()))
