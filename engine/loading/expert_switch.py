"""Hand the device budget from one expert to the other when the pipeline switches (Wan 2.2 A14B).

The plan (engine/planning/plan.py, engine/planning/experts.py) gives each expert the policy's residency over its own
blocks; the streamer holds both experts' masters and rings through the running one's blocks only. A
forward pre-hook on each expert notices when the pipeline calls the one that is not running — diffusers'
boundary step, whatever `boundary_ratio` it was built with — and re-plans the streamer there, inside the
request, before that expert's first block: the old expert's resident blocks are released, the new one's
copied from their masters (pinned, or read from their files), and the ring rebuilt over the new expert's
streamed blocks. One `ExpertSwitched` event says what moved and how long it took.

Read ahead: an expert's blocks may live in the page cache or on disk (`Plan.tiers`, chosen under
`--ram-budget`), never pinned, read through the streamer's bounce ring when they run or become resident.
So that the switch does not wait for those reads, the hook on the running expert also spots the last
forward before a switch, from the pipeline's own schedule (`pipe.scheduler.timesteps`, its `boundary_ratio`,
one forward per step or two with classifier-free guidance): the last of the boundary step's predecessor,
or the request's last (the first expert comes back after it). There it asks the streamer to read the next
expert's first blocks instead of the running ring's first ones again (`read_ahead_for`), while the running
expert computes, and publishes `ExpertPrefetch`. A wrong guess costs only the reads: the ring reads what
it misses.

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
from ..events import ExpertPrefetch, ExpertSwitched
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
        self.pipe: Any = None  # the running request's pipeline (its schedule tells the last forward before a switch)
        self._seen: tuple[float | None, int] = (None, 0)  # the last forward's timestep and its count at that timestep
        self._armed: tuple[int, list[str]] | None = None  # the expert read ahead for, the blocks being read
        self._hooks = Hooks()
        for i, m in enumerate(modules):
            self._hooks.before(m, self._hook(i), with_kwargs=True)

    def set_experts(self, experts: tuple[Expert, ...]) -> None:
        """A live re-plan's new residencies (the streamer already carries the first expert's)."""
        self.experts, self.active = experts, 0

    def _hook(self, index: int) -> Any:
        def hook(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            timestep = _first_value(kwargs.get("timestep", args[1] if len(args) > 1 else None))
            if index != self.active:
                self.switch_to(index, "boundary", timestep)
            self._read_ahead(timestep)

        return hook

    def _read_ahead(self, timestep: float | None) -> None:
        """On the running expert's last forward before a switch, read the next expert's first blocks ahead."""
        t, count = self._seen
        self._seen = (timestep, count + 1 if timestep == t else 1)
        following = next_expert(self.pipe, timestep, self._seen[1]) if timestep is not None else None
        if following is None or following == self.active:
            self._disarm()  # the schedule went another way
            return
        if self._armed is not None and self._armed[0] == following:
            return  # the step's other forward: already reading
        residency, active = streamer_residency(self.experts, following, self.streamer.residency.num_blocks)
        names = self.streamer.read_ahead_for(residency, active)
        self._armed = (following, names)
        if names:
            self.bus.publish(ExpertPrefetch(request_id=self.request_id, to_expert=self.experts[following].name,
                                            timestep=timestep, blocks=len(names),
                                            nbytes=self.streamer.region_bytes(names)))

    def begin_request(self, request_id: int, pipe: Any) -> None:
        """A request starts on `pipe`: its schedule tells the last forward before each switch."""
        self.request_id, self.pipe = request_id, pipe
        self._seen = (None, 0)
        self._disarm()

    def _disarm(self) -> None:
        """No switch is coming (a request ended or was cancelled before it): the ring reads its own blocks again."""
        if self._armed is not None:
            self.streamer.read_ahead_for(None)
            self._armed = None

    def switch_to(self, index: int, reason: str, timestep: float | None = None) -> ExpertSwitched:
        """Release the running expert's resident blocks, place expert `index`'s; publish and return the event."""
        try:
            return self._switch(index, reason, timestep)
        finally:
            self.changed()

    def _switch(self, index: int, reason: str, timestep: float | None) -> ExpertSwitched:
        residency, active = streamer_residency(self.experts, index, self.streamer.residency.num_blocks)
        prefetched = 0
        if self._armed is not None and self._armed[0] == index:  # read (or being read) before the switch
            ready = set(self.streamer.queued_reads)
            prefetched = self.streamer.region_bytes([n for n in self._armed[1] if n in ready])
        self._armed = None
        stats = self.streamer.replan(residency, active=active)
        event = ExpertSwitched(request_id=self.request_id, from_expert=self.experts[self.active].name,
                               to_expert=self.experts[index].name, reason=reason, timestep=timestep,
                               copied_bytes=stats.copied_bytes, freed_bytes=stats.freed_bytes,
                               ring_bytes=stats.ring_bytes, seconds=stats.seconds, prefetched_bytes=prefetched)
        self.active = index
        self.switches += 1
        self.bus.publish(event)
        return event

    def restore(self) -> ExpertSwitched | None:
        """Put the first expert back (the next request starts as the load left it); None when it runs."""
        if self.active == 0 or not self.streamer.attached:
            if self.streamer.attached:
                self._disarm()  # a request that ended before its switch
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


def next_expert(pipe: Any, timestep: float, count: int) -> int | None:
    """The expert that runs after this forward (`count`: forwards so far at `timestep`), when it is its step's
    last: 1 below the boundary, 0 above it or after the request's last step (the first comes back); None when
    it is not the step's last forward, or the pipeline's schedule is not known (no read ahead then)."""
    scheduler = getattr(pipe, "scheduler", None)
    timesteps = getattr(scheduler, "timesteps", None)
    config = getattr(pipe, "config", None)
    ratio = config.get("boundary_ratio") if hasattr(config, "get") else None
    train = getattr(getattr(scheduler, "config", None), "num_train_timesteps", None)
    if timesteps is None or ratio is None or train is None:
        return None
    if count < (2 if getattr(pipe, "do_classifier_free_guidance", False) else 1):
        return None
    values = [float(x) for x in (timesteps.tolist() if isinstance(timesteps, torch.Tensor) else timesteps)]
    at = [i for i, v in enumerate(values) if abs(v - timestep) <= 1e-6 * max(1.0, abs(v))]
    if not at:
        return None
    pos = at[-1]
    if pos + 1 == len(values):
        return 0
    return 0 if values[pos + 1] >= ratio * train else 1
