"""Where diffusers decides to skip blocks, read for the streamer's ring: the decision drives the prefetch.

First-Block Cache, MagCache and SeaCache (diffusers.hooks) share one state per cache context among a DiT's block
hooks: the head block's hook decides for the forward (`should_compute`; SeaCache's `skip_remaining`, where the
leader itself returns the cached residual without running), and every later block's hook returns its input
untouched on a hit. `SkipFollower` reads that flag right after the head block ran (a post-hook on it)
and answers `skips(block)` for the later blocks, so the ring copies none of them and refills its window from
the next block that runs (`LayerwiseStreamer.follow_skips`). Before the head of a forward has run, the answer
is the previous forward's decision (a prediction; a wrong one costs one block's copy, never a stale block:
a block the ring skipped holds no bytes, so running it would fail, not compute on old weights).

The cache mathematics stays diffusers'; this only reads its decision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...offload.module_hooks import Hooks


def _skips_after_head(manager: Any) -> bool:
    """First-Block Cache, MagCache: the head's hook set `should_compute` for this forward."""
    return not manager.get_state().should_compute


def _sea_skips(manager: Any) -> bool:
    """SeaCache: the leader's hook set `skip_remaining` (no cache context: diffusers runs every block)."""
    return manager._context is not None and bool(manager.get_state().skip_remaining)


# (head hook, later blocks' hook, the decision once the head ran) of the kinds that skip whole blocks
_SKIPPING_HOOKS = (("fbc_leader_block_hook", "fbc_block_hook", _skips_after_head),
                   ("mag_cache_leader_block_hook", "mag_cache_block_hook", _skips_after_head),
                   ("sea_cache_leader_block", "sea_cache_block", _sea_skips))


def _hook(module: torch.nn.Module, name: str) -> Any:
    registry = getattr(module, "_diffusers_hook", None)
    return registry.get_hook(name) if registry is not None else None


class SkipFollower:
    """One DiT's block-skip decision per forward, and how often the cache hit (see the module docstring)."""

    def __init__(self, dit: torch.nn.Module, hooks: Hooks, on_decided: Callable[[], None]) -> None:
        self._followers: set[int] = set()
        self._manager: Any = None
        self._on_decided = on_decided
        self._current: bool | None = None  # this forward's decision, once its head block ran
        self._last = False
        self.forwards = self.hits = 0  # decisions so far, and how many skipped the later blocks
        self._read: Callable[[Any], bool] = _skips_after_head
        for head_name, block_name, read in _SKIPPING_HOOKS:
            for module in dit.modules():
                head, block = _hook(module, head_name), _hook(module, block_name)
                if head is not None:
                    self._manager, self._read = head.state_manager, read
                    hooks.after(module, self._decided, prepend=True)  # before the ring's post-hook
                if block is not None and head is None:
                    self._followers.add(id(module))
            if self._manager is not None:
                break
        if self._manager is not None:
            hooks.before(dit, self._forward_starts)

    @property
    def active(self) -> bool:
        """Whether this DiT's cache skips whole blocks (First-Block Cache, MagCache, SeaCache)."""
        return self._manager is not None and bool(self._followers)

    def _forward_starts(self, *_: Any) -> None:
        self._current = None

    def _decided(self, *_: Any) -> None:
        try:
            hit = self._read(self._manager)
        except ValueError:  # no cache context: diffusers computes every block
            hit = False
        self._current = self._last = hit
        self.forwards += 1
        self.hits += hit
        self._on_decided()

    def skips(self, module: torch.nn.Module) -> bool:
        """True when `module` (a block after the head) will not run in this forward."""
        if id(module) not in self._followers:
            return False
        return self._current if self._current is not None else self._last
