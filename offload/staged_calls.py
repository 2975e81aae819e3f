"""`stage_around`: a staged component's calls load it before and offload it after (offload/stager.py).

The calls are wrapped through `Hooks.wrap` (offload/module_hooks.py), not forward hooks: a VAE's
`decode` or an encoder's `encode` is no `forward`, and the offload must also run when the call raises.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from .module_hooks import Hooks


class Staged(Protocol):
    """What `stage_around` drives: a `ModuleStager` or a `LayerStage`."""

    name: str

    @property
    def held(self) -> bool: ...
    def load(self) -> None: ...
    def offload(self) -> None: ...


def stage_around(
    stager: Staged, module: torch.nn.Module, method_names: Sequence[str] = ("forward",)
) -> Callable[[], None]:
    """Wrap `module`'s methods so each outermost call loads before and offloads after.

    Nested calls (forward calling decode) share one depth counter: one load, one offload. The
    offload also runs when the call raises; a failing offload then does not hide the original
    error. Returns a callable that removes the wrappers.
    """
    depth = 0
    hooks = Hooks()

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def staged(*args: Any, **kwargs: Any) -> Any:
            nonlocal depth
            if stager.held:  # resident for now (a live re-plan): already on the device
                return fn(*args, **kwargs)
            if depth == 0:
                stager.load()
            depth += 1
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                depth -= 1
                if depth == 0:
                    try:
                        stager.offload()
                    except Exception as cleanup:
                        exc.add_note(f"offloading {stager.name} afterwards also failed: {cleanup!r}")
                raise
            depth -= 1
            if depth == 0:
                stager.offload()
            return result

        return staged

    for name in method_names:
        hooks.wrap(module, name, wrap)
    return hooks.remove
