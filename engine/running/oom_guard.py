"""No out-of-memory error ends a request: release, step down, retry the phase's call once.

During a request the guard wraps the calls each phase is made of: every text/image encoder's
`forward` (text encoding), every denoiser's `forward` (denoise: one DiT forward, i.e. one step, or
half of one with guidance), the VAE's `decode` (VAE decode). On `torch.OutOfMemoryError` in one of
them it lets the failed call unwind (its tensors are freed with its frames), collects garbage and
empties the allocator cache, steps the policy down (`lower_policy`: fewer resident DiT blocks, then
a two-slot ring, then the encoders and VAEs staged; for the decode every resident block goes at
once, the DiT has finished, and a leaner decode too when `EngineOptions.lean_decode` is set),
publishes an `OomStepDown` event, and calls the same function again with the same arguments. A
denoiser's forward and an encoder's are pure functions of their inputs, so the retried call gives
what an unfaulted run at the stepped-down policy gives (bit-identical on a CPU, where every policy
is). A second out-of-memory error in the same phase ends the request with one line (the cache is
released first); no output of a half-failed call is ever kept, since only a call that returned is
used.

Stepping the residency down needs the masters of the resident blocks (a `live_replan` load;
`run --vram-budget` loads so): without them only the ring's depth can shrink.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from ...offload.module_hooks import Hooks
from ..events import OomStepDown

if TYPE_CHECKING:
    from ...offload.policy import OffloadPolicy
    from ..engine import Engine
    from ..planning.plan import Plan

def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def lower_policy(plan: Plan, phase: str) -> tuple[OffloadPolicy, str] | None:
    """A policy that needs less device memory than `plan`'s, and what it changes; None: nothing left.

    Resident blocks kept upcast back to fp8 first (fp8 storage), then fewer resident DiT blocks (half
    of them; all of them when the decode ran out, the DiT has finished by then; another count when that
    one would hold no fewer device bytes), then the ring down to 2 slots, then every resident encoder
    and VAE staged."""
    from ..planning.lora_cost import with_lora
    from ..planning.plan import make_plan

    policy, r = plan.policy, plan.residency
    if policy.mode != "dlo":
        return None
    if r.num_upcast:  # the cheapest bytes to give back: blocks kept upcast go back to fp8 (only a little slower)
        return (policy.model_copy(update=dict(upcast_resident=0)),
                f"{plan.model.block_kind} blocks kept upcast {r.num_upcast}→0 (fp8 again, upcast per forward)")
    n = r.num_resident
    # the most freeing first for the decode; else half, then fewer, then more (a big block turned
    # streamed can enlarge every slot, so a count is taken only if the device bytes really drop)
    counts = range(n) if phase == "vae_decode" else [*range(n // 2, -1, -1), *range(n // 2 + 1, n)]
    depths = [2] if phase == "vae_decode" else sorted({policy.prefetch_slots, 2}, reverse=True)
    for slots in depths:
        for keep in counts:
            lower = policy.model_copy(update=dict(resident_layers=keep, prefetch_slots=slots))
            new = with_lora(make_plan(plan.model, lower), plan.lora_device_bytes)
            if device_weights(new) < device_weights(plan):
                ring = f"ring {r.slots}→{new.residency.slots} slots" if new.residency.slots != r.slots else ""
                if keep == n:
                    return lower, f"prefetch {ring}"
                return lower, f"{plan.model.block_kind} resident blocks {n}→{keep}" + (f", {ring}" if ring else "")
    if policy.prefetch_slots > 2 and r.num_streamed > 2:
        return policy.model_copy(update=dict(prefetch_slots=2)), f"prefetch ring {r.slots}→2 slots"
    resident = [c.info.name for c in plan.components if c.residency == "resident" and c.info.role in ("encoder", "vae")]
    if resident:
        components = {**policy.dlo_offload_components, **{name: True for name in resident}}
        return (policy.model_copy(update=dict(dlo_offload_components=components)),
                f"{', '.join(sorted(resident))} staged")
    return None


def device_weights(plan: Plan) -> int:
    """Device bytes of weights outside any one phase: resident components and blocks, the ring's slots."""
    f = plan.forecast
    return f.device_resident_bytes + f.streaming_slots * f.largest_streamed_block_bytes


def release_cache(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def step_down(engine: Engine, phase: str) -> str:
    """Carry out `lower_policy` on the loaded engine, as far as this load allows; what was done."""
    from ..loading.replan import apply_replan
    from ..planning.lora_cost import with_lora
    from ..planning.plan import make_plan

    plan, placement = engine.plan, engine.placement
    assert plan is not None and placement is not None
    lower = lower_policy(plan, phase)
    streamer = placement.streamer
    done: list[str] = []
    if lower is not None and placement.live and not plan.experts:
        new = replace(with_lora(make_plan(engine.model, lower[0]), plan.lora_device_bytes),
                      tiers=plan.tiers)  # the masters stay where they are
        event = apply_replan(placement, plan, new, engine.device)
        engine.plan = new
        engine.bus.publish(event)
        done.append(lower[1])
    elif streamer is not None and streamer.residency.slots > 2 and streamer.num_streamed > 2:
        before = streamer.residency.slots
        streamer.set_slots(2)
        done.append(f"prefetch ring {before}→2 slots (resident blocks stay: loaded without live re-plan)")
    # the decode is the one phase a leaner variant of helps directly (and the DiT has finished)
    lean_decode = engine.options.lean_decode
    if phase == "vae_decode" and lean_decode is not None and (lean := lean_decode(engine.pipe)):
        done.append(lean)
    if done:
        return "; ".join(done)
    why = "two experts re-plan between requests" if plan.experts and lower else "nothing left to step down"
    return f"cache released only ({why})"


@dataclass(frozen=True, slots=True)
class Target:
    phase: str
    component: str
    owner: Any  # the module whose method is wrapped
    method: str


def request_targets(engine: Engine) -> list[Target]:
    """The calls each phase is made of, on the loaded pipeline (see the module docstring)."""
    pipe, targets = engine.pipe, []
    for info in engine.model.components:
        module = getattr(pipe, info.name, None)
        if not isinstance(module, torch.nn.Module):
            continue
        if info.role == "encoder":
            targets.append(Target("text_encoding", info.name, module, "forward"))
        elif info.role in ("dit", "unet"):
            targets.append(Target("denoise", info.name, module, "forward"))
        elif info.role == "vae" and hasattr(module, "decode"):
            targets.append(Target("vae_decode", info.name, module, "decode"))
    return targets


class OomGuard:
    """Wraps one request's phase calls (`install` → undo); `events`: the step-downs it made."""

    def __init__(self, engine: Engine, request_id: int, targets: list[Target] | None = None,
                 step: Callable[[str], str] | None = None) -> None:
        self.engine, self.request_id = engine, request_id
        self.targets = request_targets(engine) if targets is None else targets
        self._step = step or (lambda phase: step_down(engine, phase))
        self.events: list[OomStepDown] = []
        self._retried: set[str] = set()

    def _release(self) -> None:
        release_cache(self.engine.device)

    def _wrap(self, target: Target, fn: Callable[..., Any]) -> Callable[..., Any]:
        active = False

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            nonlocal active
            if active:  # a nested call of the same method: the outer one retries
                return fn(*args, **kwargs)
            active = True
            try:
                return self._call(target, fn, args, kwargs)
            finally:
                active = False

        return guarded

    def _call(self, target: Target, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return fn(*args, **kwargs)
        except torch.OutOfMemoryError as exc:
            message = first_line(exc)
            again = target.phase in self._retried
        # out of the handler: the failed call's frames (and the tensors they held) are gone
        self._release()
        if again:
            raise torch.OutOfMemoryError(f"out of device memory again in {target.phase.replace('_', ' ')} "
                                         f"({target.component}) after stepping down: {message}")
        self._retried.add(target.phase)
        action = self._step(target.phase)
        self._release()
        event = OomStepDown(request_id=self.request_id, phase=target.phase, component=target.component,
                            action=action, message=message)
        self.events.append(event)
        self.engine.bus.publish(event)  # the log's and `run`'s progress line (console/event_text.py)
        try:
            return fn(*args, **kwargs)
        except torch.OutOfMemoryError as exc:
            message = first_line(exc)
        self._release()
        raise torch.OutOfMemoryError(f"out of device memory again in {target.phase.replace('_', ' ')} "
                                     f"({target.component}) after stepping down ({action}): {message}")

    def install(self) -> Callable[[], None]:
        """Wrap every target's method (outside any stager's own wrapper); returns the undo."""
        hooks = Hooks()
        for target in self.targets:
            hooks.wrap(target.owner, target.method, lambda fn, target=target: self._wrap(target, fn))
        return hooks.remove


@contextlib.contextmanager
def guarded_request(engine: Engine, request_id: int) -> Iterator[OomGuard | None]:
    """The guard around one request; none in a rank group (a retried forward would re-issue the
    collectives its peers have moved past: there the rank fails and the group stops, as before)."""
    if engine.group is not None:
        yield None
        return
    guard = OomGuard(engine, request_id)
    undo = guard.install()
    try:
        yield guard
    finally:
        undo()
