"""Hand the device budget from one expert to the other when the pipeline switches (Wan 2.2 A14B).

The plan (engine/planning/plan.py, engine/planning/experts.py) gives each expert the policy's residency over its own
blocks; the streamer holds both experts' masters and rings through the running one's blocks only. A
forward pre-hook on each expert notices when the pipeline calls the one that is not running — diffusers'
boundary step, whatever `boundary_ratio` it was built with — and re-plans the streamer there, inside the
request, before that expert's first block: the old expert's resident blocks are released, the new one's
copied from their pinned masters, and the ring rebuilt over the new expert's streamed blocks. One
`ExpertSwitched` event says what moved and how long it took.

Policy between requests: `restore()` (called by the engine when a request ends, ok or not) puts the
first expert back, so every request starts as the load left it, with one switch at its boundary step;
the move back is its own event (reason "request end"), outside the request's denoise steps.
"""

from __future__ import annotations

from typing import Any

import torch

from ...offload.events import EventBus
from ...offload.module_hooks import Hooks, Listeners
from ...offload.streamer import LayerwiseStreamer
from ..events import ExpertSwitched
from ..planning.experts import Expert, streamer_residency


class ExpertSwitch:
    """Pre-hooks on the experts' modules that re-plan the streamer when the other expert is called."""

    def __init__(self, streamer: LayerwiseStreamer, experts: tuple[Expert, ...], modules: list[torch.nn.Module],
                 bus: EventBus) -> None:
        self.streamer, self.experts, self.bus = streamer, experts, bus
        self.active = 0  # the load places the first expert
        self.request_id: int | None = None
        self.switches = 0
        self.changed = Listeners()  # called after each switch (the residency watch publishes)
        self._hooks = Hooks()
        for i, m in enumerate(modules):
            self._hooks.before(m, self._hook(i), with_kwargs=True)

    def set_experts(self, experts: tuple[Expert, ...]) -> None:
        """A live re-plan's new residencies (the streamer already carries the first expert's)."""
        self.experts, self.active = experts, 0

    def _hook(self, index: int) -> Any:
        def hook(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if index != self.active:
                timestep = kwargs.get("timestep", args[1] if len(args) > 1 else None)
                self.switch_to(index, "boundary", _first_value(timestep))

        return hook

    def switch_to(self, index: int, reason: str, timestep: float | None = None) -> ExpertSwitched:
        """Release the running expert's resident blocks, place expert `index`'s; publish and return the event."""
        try:
            return self._switch(index, reason, timestep)
        finally:
            self.changed()

    def _switch(self, index: int, reason: str, timestep: float | None) -> ExpertSwitched:
        residency, active = streamer_residency(self.experts, index, self.streamer.residency.num_blocks)
        stats = self.streamer.replan(residency, active=active)
        event = ExpertSwitched(request_id=self.request_id, from_expert=self.experts[self.active].name,
                               to_expert=self.experts[index].name, reason=reason, timestep=timestep,
                               copied_bytes=stats.copied_bytes, freed_bytes=stats.freed_bytes,
                               ring_bytes=stats.ring_bytes, seconds=stats.seconds)
        self.active = index
        self.switches += 1
        self.bus.publish(event)
        return event

    def restore(self) -> ExpertSwitched | None:
        """Put the first expert back (the next request starts as the load left it); None when it runs."""
        if self.active == 0 or not self.streamer.attached:
            return None
        return self.switch_to(0, "request end")

    def close(self) -> None:
        self._hooks.remove()


def _first_value(timestep: Any) -> float | None:
    """The forward's timestep as a number (a tensor of one per batch item in Wan's pipelines)."""
    if isinstance(timestep, torch.Tensor) and timestep.numel():
        return float(timestep.flatten()[0].item())
    if isinstance(timestep, (int, float)):
        return float(timestep)
    return None
