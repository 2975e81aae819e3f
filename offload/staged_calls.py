"""`stage_around`: a staged component's calls load it before and offload it after (offload/stager.py).

The calls are wrapped through `Hooks.wrap` (offload/module_hooks.py), not forward hooks: a VAE's
`decode` or an encoder's `encode` is no `forward`, and the offload must also run when the call raises.

Some pipelines also call into a component's submodules directly, outside any wrapped method: SD 1.x
with `clip_skip` runs `text_encoder.text_model.final_layer_norm` on the hidden states after the forward
returned, Ideogram 4 runs its encoder's embedding and layers one by one. With `lazy`, such a call loads
the component first (its weights are on the host between stages), and `LazyStages` keeps it loaded until
the next stage boundary: another component's stage, or the denoiser's forward (`close`).
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
    @property
    def loaded(self) -> bool: ...
    def load(self) -> None: ...
    def offload(self) -> None: ...


class LazyStages:
    """Components loaded by a direct call into one of their submodules, offloaded at the next stage boundary."""

    def __init__(self) -> None:
        self.open: list[Staged] = []

    def take(self, stager: Staged) -> None:
        """`stager`'s stage begins: every other lazily loaded component is offloaded; `stager` itself, if
        lazily loaded, is now its caller's to offload."""
        self.close(keep=stager)
        if stager in self.open:
            self.open.remove(stager)

    def close(self, keep: Staged | None = None) -> None:
        """Offload every lazily loaded component (but `keep`)."""
        for stager in [s for s in self.open if s is not keep]:
            self.open.remove(stager)
            stager.offload()


def stage_around(
    stager: Staged, module: torch.nn.Module, method_names: Sequence[str] = ("forward",),
    lazy: LazyStages | None = None,
) -> Callable[[], None]:
    """Wrap `module`'s methods so each outermost call loads before and offloads after.

    Nested calls (forward calling decode) share one depth counter: one load, one offload. The
    offload also runs when the call raises; a failing offload then does not hide the original
    error. With `lazy`, a submodule called outside those methods loads the component first (module
    docstring). Returns a callable that removes the wrappers.
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
                if lazy is not None:
                    lazy.take(stager)
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

    def load_lazily(*_: Any) -> None:
        if depth == 0 and not stager.held and not stager.loaded:
            assert lazy is not None  # installed only with it
            lazy.take(stager)
            stager.load()
            lazy.open.append(stager)

    for name in method_names:
        hooks.wrap(module, name, wrap)
    if lazy is not None:  # first among each submodule's pre-hooks (a streamed encoder's layer ring runs after)
        for sub in module.modules():
            if sub is not module:
                hooks.before(sub, load_lazily, prepend=True)
    return hooks.remove
