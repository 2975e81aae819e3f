"""The one way this project intercepts a module call: `Hooks`, a set of interceptions removed together.

- A module's `forward` is intercepted with torch's own forward hooks (`before`: a pre-hook, `after`: a
  post-hook; `with_kwargs`, `prepend` and `always_call` as torch has them), never by replacing
  `forward`: the module and its `__call__` stay the library's, and hooks compose (the streamer's, the
  block timer's, the cancel check, the order watch) in registration order.
- A call that is not `forward` (a VAE's `decode`, an encoder's `encode`, a whole `forward` that must
  be replaced, such as CFG-parallel's split) is wrapped with `wrap`: the wrapper is an instance
  attribute over the class's method, and `remove` puts back exactly what was there.
- Engine objects that others follow (a stager's load/offload, an expert switch) call listeners
  (`Listeners`) instead of being wrapped.

`remove()` undoes everything the set installed, newest first. diffusers' own hooks
(`enable_layerwise_casting`, the exactness reference) are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class _Unwrap:
    """Puts back what `Hooks.wrap` replaced: the instance's own attribute, or none (the class's method)."""

    __slots__ = ("obj", "name", "had_own", "previous")

    def __init__(self, obj: Any, name: str) -> None:
        self.obj, self.name = obj, name
        self.had_own = name in vars(obj)
        self.previous = vars(obj).get(name)

    def remove(self) -> None:
        if self.had_own:
            setattr(self.obj, self.name, self.previous)
        else:
            vars(self.obj).pop(self.name, None)


class _Call:
    """A plain undo callable as a handle."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn

    def remove(self) -> None:
        self.fn()


class Hooks:
    """Interceptions installed together and removed together (see the module docstring)."""

    __slots__ = ("_handles",)

    def __init__(self) -> None:
        self._handles: list[Any] = []

    def __len__(self) -> int:
        return len(self._handles)

    def before(self, module: torch.nn.Module, fn: Callable[..., Any], *, with_kwargs: bool = False,
               prepend: bool = False) -> None:
        """`fn(module, args[, kwargs])` before each forward of `module`."""
        self._handles.append(module.register_forward_pre_hook(fn, with_kwargs=with_kwargs, prepend=prepend))

    def after(self, module: torch.nn.Module, fn: Callable[..., Any], *, with_kwargs: bool = False,
              always_call: bool = False, prepend: bool = False) -> None:
        """`fn(module, args, [kwargs,] output)` after each forward of `module` (`always_call`: also when
        it raises; `prepend`: before the post-hooks already there)."""
        self._handles.append(module.register_forward_hook(fn, with_kwargs=with_kwargs, always_call=always_call,
                                                          prepend=prepend))

    def wrap(self, obj: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Replace `obj.name` (a bound method, or an earlier wrapper) by `make(current)` on the instance."""
        undo = _Unwrap(obj, name)
        setattr(obj, name, make(getattr(obj, name)))
        self._handles.append(undo)

    def add(self, undo: Callable[[], None]) -> None:
        """Undo something else with the set (a listener's removal)."""
        self._handles.append(_Call(undo))

    def remove(self) -> None:
        """Undo every interception, newest first. Idempotent."""
        handles, self._handles = self._handles, []
        for h in reversed(handles):
            h.remove()


class Listeners:
    """Callbacks an engine object calls after something it did (instead of being wrapped)."""

    __slots__ = ("_fns",)

    def __init__(self) -> None:
        self._fns: list[Callable[[], None]] = []

    def add(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call `fn()` after each event from now on; returns its removal."""
        self._fns.append(fn)
        return lambda: self._fns.remove(fn) if fn in self._fns else None

    def __call__(self) -> None:
        for fn in list(self._fns):
            fn()
