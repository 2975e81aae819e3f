"""Blocks a step cache skips on a schedule, read for the streamer's ring: TaylorSeer's whole-block hooks.

diffusers' TaylorSeer hooks modules by name. By default it hooks the attention modules inside blocks (their
output predicted on cached steps: the block still runs, so every block's bytes are still needed). Hooked on a
whole block (`use_lite_mode=true`, or `skip_predict_identifiers` / `cache_identifiers` naming blocks), a
predicted step returns the block's output without running it: its bytes need not cross the link.

Whether the next call of a hooked block computes is diffusers' own schedule (`_measure_should_compute`: warm-up,
interval, cool-down), asked without consuming the step: the counter it advances is set back. A prediction made
ahead (the ring's window) may meet another cache context (cond/uncond) when the block runs; the ring asks again
right before the block runs, so a wrong guess costs one block's copy, never a stale block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...offload.module_hooks import Hooks

_HOOK = "taylorseer_cache"


def _hook(module: torch.nn.Module) -> Any:
    registry = getattr(module, "_diffusers_hook", None)
    return registry.get_hook(_HOOK) if registry is not None else None


def _computes_next(hook: Any) -> bool:
    """Whether the hooked module's next call runs it (diffusers' schedule, the step counter set back)."""
    try:
        should_compute, state = hook._measure_should_compute()
    except ValueError:  # no cache context: diffusers' hook cannot run either; the block computes
        return True
    state.current_step -= 1
    return bool(should_compute)


class ScheduleFollower:
    """One DiT's TaylorSeer-hooked blocks (direct items of its block lists): which skip their next call."""

    def __init__(self, dit: torch.nn.Module, hooks: Hooks, on_decided: Callable[[], None]) -> None:
        self._hooks_of: dict[int, Any] = {}
        for child in dit.children():
            if isinstance(child, torch.nn.ModuleList):
                for block in child:
                    hook = _hook(block)
                    if hook is not None:
                        self._hooks_of[id(block)] = hook
        self._first = next(iter(self._hooks_of.values()), None)
        self._on_decided = on_decided
        self.forwards = self.hits = 0
        if self._first is not None:
            hooks.before(dit, self._forward_starts)

    @property
    def active(self) -> bool:
        """Whether TaylorSeer predicts whole blocks of this DiT (not only modules inside them)."""
        return self._first is not None

    def _forward_starts(self, *_: Any) -> None:
        hit = not _computes_next(self._first)  # one config: every hooked block keeps the same schedule
        self.forwards += 1
        self.hits += hit
        self._on_decided()  # the context is set now: the ring refills its window past the predicted blocks

    def skips(self, module: torch.nn.Module) -> bool:
        """True when `module`'s next call returns TaylorSeer's prediction without running the block."""
        hook = self._hooks_of.get(id(module))
        return hook is not None and not _computes_next(hook)
