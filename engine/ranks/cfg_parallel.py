"""CFG-parallel on two ranks: a guided step's conditional and unconditional DiT calls run at once.

Guided pipelines (Flux with a negative prompt, Wan, ...) call the DiT twice per step, the second call
with the same latents and timestep and the negative prompt's embeddings. Both ranks run the whole
pipeline; `CfgSplit` wraps the DiT's `forward`:
- the first guided step runs both calls on both ranks and learns which arguments make the second
  call unconditional (those that differ between the two calls: the negative embeddings);
- from then on, at a step's first call, rank 0 computes it while rank 1 computes the second call
  (the first call's arguments with the learned ones swapped in); the two outputs are exchanged with
  one `all_gather_into_tensor`, the first call returns the conditional output and the second returns
  the unconditional one without computing, once its real arguments are checked equal to the
  predicted ones (otherwise both ranks compute it, as one rank would).
Each output comes from exactly the inputs one rank would have used, so images match one rank's.
Both ranks run the same number of DiT forwards in the same order, as AllGather streaming requires.
A pipeline that calls its DiT once per step (no unconditional branch) is run unsplit.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ...offload.allgather_streamer import gather_into
from ...offload.module_hooks import Hooks


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and a.device == b.device and bool(torch.equal(a, b)))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that cannot compare are different
        return a is b


def _first_tensor(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out.sample


def _with_tensor(out: Any, tensor: torch.Tensor) -> Any:
    if isinstance(out, tuple):
        return (tensor, *out[1:])
    return type(out)(sample=tensor)


class CfgSplit:
    """Wraps `module.forward` on this rank of a two-rank group (see the module docstring)."""

    def __init__(self, module: torch.nn.Module, group: Any = None) -> None:
        if dist.get_world_size(group) != 2:
            raise ValueError("CFG-parallel splits two branches over exactly two ranks")
        self.module = module
        self.group = group
        self.rank = dist.get_rank(group)
        self._forward = module.forward
        self._branch: dict[str, Any] | None = None  # learned: the unconditional call's own arguments
        self._off = False  # two calls of one step never seen: nothing to split
        self._previous: dict[str, Any] | None = None  # the last computed call's kwargs, while learning
        self._stash: tuple[dict[str, Any], Any] | None = None  # (predicted second-call kwargs, its output)
        self.split_steps = 0
        self.mispredicted = 0
        self._hooks = Hooks()  # the whole forward is replaced: a hook cannot skip or swap the call
        self._hooks.wrap(module, "forward", lambda _forward: self._call)

    def remove(self) -> None:
        self._hooks.remove()

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        if args:  # positional calls cannot be matched argument by argument: run unsplit
            return self._forward(*args, **kwargs)
        if self._stash is not None:
            predicted, output = self._stash
            self._stash = None
            if predicted.keys() == kwargs.keys() and all(_same(predicted[k], kwargs[k]) for k in kwargs):
                return output
            self.mispredicted += 1  # both ranks see the same call: both compute it
            return self._forward(**kwargs)
        if self._branch is not None:
            return self._split(kwargs)
        out = self._forward(**kwargs)
        if not self._off:
            self._learn(kwargs)
        return out

    def _learn(self, kwargs: dict[str, Any]) -> None:
        previous, self._previous = self._previous, kwargs
        if previous is None:
            return
        same_step = all(_same(previous.get(k), kwargs.get(k)) for k in ("hidden_states", "timestep"))
        if not same_step or previous.keys() != kwargs.keys():
            self._off = True
            self._previous = None
            return
        self._branch = {k: v for k, v in kwargs.items() if not _same(previous[k], v)}
        self._previous = None
        if not self._branch:  # two identical calls: nothing tells the branches apart
            self._branch, self._off = None, True

    def _split(self, kwargs: dict[str, Any]) -> Any:
        assert self._branch is not None
        second = {**kwargs, **self._branch}
        out = self._forward(**(kwargs if self.rank == 0 else second))
        mine = _first_tensor(out).contiguous()
        both = torch.empty(2 * mine.numel(), dtype=mine.dtype, device=mine.device)
        gather_into(both, mine.view(-1), self.group)
        first, second_out = (half.view(mine.shape) for half in both.chunk(2))
        self._stash = (second, _with_tensor(out, second_out))
        self.split_steps += 1
        return _with_tensor(out, first)
