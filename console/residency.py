"""Where each loaded component's weights are now, as ResidencyPanel rows (no Textual here).

Read from the engine's placement on the UI thread: stagers' `loaded` flags and the streamer's
`block_states()` are plain attribute reads, and a placement being released under us yields
None (the panel keeps its last rows) rather than an error.

With two experts (Wan 2.2 A14B) the idle expert's blocks are parked: out of the ring, only their
pinned masters kept. They are not "host" blocks waiting for their turn in this forward, so they
show as one `idle_expert` row per idle expert that names the running one.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

Row = tuple[str, str, int]
IDLE_EXPERT = "idle_expert"
"""The state of a parked expert's blocks (console/widgets/residency_panel.py shows it as "idle expert")."""
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


def residency_rows(engine: Any, aggregate_above: int = AGGREGATE_ABOVE) -> list[Row] | None:
    """Rows for every weighted component of the loaded plan; None when nothing is placed."""
    placement, plan = engine.placement, engine.plan
    if placement is None or plan is None:
        return None
    try:
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
    except Exception:  # released concurrently by the engine thread: keep the last rows
        return None


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
