"""Regional compile of streamed blocks: each repeated block class's `forward` compiled once, hooks left eager.

diffusers' `compile_repeated_blocks` calls `submodule.compile()`, which compiles the module's whole
`_call_impl`: its forward hooks would be traced into the graph. Ours must not be: the ring's hooks
re-point parameters into slots (`param.data = ...`), wait on copy events, upcast fp8 and check
cancels. So only `forward` is compiled, and it is installed (`Hooks.wrap`, an instance attribute) where
`nn.Module._call_impl` calls between the (eager) pre- and post-hooks: the hooks sit at the graph's
boundary by construction, and `remove()` puts the class's method back.

One compiled function per block class (the class's unbound `forward`, the block passed as its first
argument), so every block of a class shares Dynamo's cache entries. Dynamo inlines `nn.Module`s and
lifts their parameters as graph inputs (always on in torch >= 2.5), so a parameter that points into
another slot at every call does not change a guard: guards check dtype, shape, stride and device,
never the address. `dynamic=False`: one graph per shape; `fullgraph=True` where it holds (a class whose
forward breaks the graph is compiled again without it, once). Guards do check strides, also of a dimension of
size 1, where a stride means nothing: Flux's first single block gets two contiguous tensors and every later one
two slices of the joint sequence (batch stride text + image tokens), so Dynamo traced, compiled and (on a warm
start) loaded a third graph for the same shapes. Each tensor argument's size-1 strides are therefore set as a
contiguous tensor has them (`as_strided`, a view: the same storage, offset and values) before the call.

`CompileWatch` counts what Dynamo did (graphs compiled, recompiles, graph breaks, seconds spent),
from Dynamo's own compile callbacks and counters, so a run can report them and a test can fail on any
recompile after warm-up.
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .module_hooks import Hooks


@dataclass(frozen=True)
class CompileSettings:
    """What `torch.compile` is asked for (the defaults are `--compile regional`'s)."""

    backend: Any = "inductor"  # a name, or a backend callable (tests)
    mode: str | None = None
    fullgraph: bool = True
    dynamic: bool = False


@dataclass(frozen=True)
class CompileCounts:
    """Dynamo's work so far (or between two snapshots): frames compiled, of which recompiles, graph breaks,
    and the wall seconds spent compiling."""

    compiles: int = 0
    recompiles: int = 0
    graph_breaks: int = 0
    seconds: float = 0.0

    def __sub__(self, other: CompileCounts) -> CompileCounts:
        return CompileCounts(self.compiles - other.compiles, self.recompiles - other.recompiles,
                             self.graph_breaks - other.graph_breaks, self.seconds - other.seconds)


class CompileWatch:
    """Counts Dynamo's compiles process-wide (its callbacks are global), from the first `watch()` on.

    A compile whose id's second number is not 0 ("frame/attempt") is Dynamo compiling a frame it had
    compiled before: a recompile. Graph breaks are Dynamo's `counters["graph_break"]`."""

    _lock = threading.Lock()
    _installed = False
    _compiles = 0
    _recompiles = 0
    _seconds = 0.0
    _started: dict[str, float] = {}

    @classmethod
    def watch(cls) -> None:
        """Install the callbacks, again where `torch._dynamo.reset()` cleared them (it clears every callback)."""
        from torch._dynamo.callback import callback_handler

        with cls._lock:
            if cls._installed and cls._on_end in getattr(callback_handler, "end_callbacks", [cls._on_end]):
                return
            callback_handler.register_start_callback(cls._on_start)
            callback_handler.register_end_callback(cls._on_end)
            cls._installed = True

    @classmethod
    def _on_start(cls, args: Any) -> None:
        with cls._lock:
            cls._started[str(args.compile_id)] = time.perf_counter()

    @classmethod
    def _on_end(cls, args: Any) -> None:
        key = str(args.compile_id)
        with cls._lock:
            began = cls._started.pop(key, None)
            if began is not None:
                cls._seconds += time.perf_counter() - began
            cls._compiles += 1
            if _is_recompile(key):
                cls._recompiles += 1

    @classmethod
    def snapshot(cls) -> CompileCounts:
        from torch._dynamo.utils import counters

        breaks = sum(counters["graph_break"].values())
        with cls._lock:
            return CompileCounts(cls._compiles, cls._recompiles, breaks, cls._seconds)


def _is_recompile(compile_id: str) -> bool:
    """"3/1" (frame 3, second compile of it) is a recompile; "3/0" is not. Odd ids count as first compiles."""
    parts = compile_id.replace("[", "").replace("]", "").split("/")
    try:
        return len(parts) >= 2 and int(parts[1].split("_")[0]) > 0
    except ValueError:
        return False


RECOMPILE_LIMIT = 64
"""Graphs Dynamo keeps per block class: one per shape, module structure (a LoRA's layers) and grad mode, which a
long console session of many sizes passes torch's default of 8; past it a call runs eager (`_ClassForward`)."""


def raise_recompile_limit() -> None:
    """Dynamo's per-code-object limit at least `RECOMPILE_LIMIT` (a process-wide setting; never lowered)."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)


class _ClassForward:
    """One block class's compiled forward, shared by all its blocks (Dynamo's cache is per code object)."""

    def __init__(self, cls: type[torch.nn.Module], settings: CompileSettings) -> None:
        self.cls, self.settings = cls, settings
        self.fullgraph = settings.fullgraph
        self.eager_calls = 0
        self.fn = self._compile(self.fullgraph)

    def _compile(self, fullgraph: bool) -> Callable[..., Any]:
        s = self.settings
        return torch.compile(self.cls.forward, backend=s.backend, mode=s.mode, fullgraph=fullgraph,
                             dynamic=s.dynamic)

    def __call__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        args = tuple(_unit_strides(a) for a in args)
        kwargs = {k: _unit_strides(v) for k, v in kwargs.items()}
        try:
            return self.fn(module, *args, **kwargs)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            self.eager_calls += 1  # past Dynamo's recompile limit for this class: this call runs eager, never fails
            return self.cls.forward(module, *args, **kwargs)
        except torch._dynamo.exc.Unsupported:
            if not self.fullgraph:
                raise
            self.fullgraph = False  # this class breaks the graph: compiled in pieces instead, once
            self.fn = self._compile(False)
            return self.fn(module, *args, **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            oom = out_of_memory_inside(exc)
            if oom is not None:  # autotuning ran out of device memory: the request's OOM guard steps down
                raise oom from exc
            raise


def _unit_strides(value: Any) -> Any:
    """`value` (a tensor, or a tuple or list of them) with each size-1 dimension's stride set to the extent of the
    dimensions after it (a contiguous tensor's, where those are contiguous), the other strides kept: a view where
    one differs, else `value` itself."""
    if type(value) in (tuple, list):
        items = [_unit_strides(v) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else type(value)(items)
    if type(value) is not torch.Tensor or value.dim() == 0:  # subclasses (DTensor, fp8 wrappers) as they come
        return value
    size, stride = value.shape, list(value.stride())
    inner, changed = 1, False
    for i in range(value.dim() - 1, -1, -1):
        if size[i] == 1:
            changed = changed or stride[i] != inner
            stride[i] = inner
        else:
            inner = stride[i] * size[i]
    return value.as_strided(size, stride, value.storage_offset()) if changed else value


def out_of_memory_inside(exc: BaseException) -> torch.OutOfMemoryError | None:
    """The device OOM a compile failure wraps (Inductor's autotuning, a benchmark run), else None: so that an
    OOM during compile reaches the OOM guard as the OOM it is."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, torch.OutOfMemoryError):
            return current
        seen.add(id(current))
        current = getattr(current, "inner_exception", None) or current.__cause__ or current.__context__
    return None


class CompiledBlocks:
    """The blocks whose `forward` is compiled (each one a `Hooks.wrap` of `forward`, so the class's method is
    never touched); `remove()` puts their own (eager) `forward` back."""

    def __init__(self, blocks: Iterable[torch.nn.Module], settings: CompileSettings = CompileSettings()) -> None:
        CompileWatch.watch()
        raise_recompile_limit()
        self.settings = settings
        self.by_class: dict[type[torch.nn.Module], _ClassForward] = {}
        self._hooks = Hooks()
        for block in blocks:
            cls = type(block)
            compiled = self.by_class.get(cls) or self.by_class.setdefault(cls, _ClassForward(cls, settings))
            self._hooks.wrap(block, "forward", lambda _eager, c=compiled, b=block: types.MethodType(c, b))

    def __len__(self) -> int:
        return len(self._hooks)

    @property
    def class_names(self) -> list[str]:
        return sorted(c.__name__ for c in self.by_class)

    @property
    def eager_calls(self) -> int:
        """Block calls that ran eager because Dynamo's recompile limit was reached for their class."""
        return sum(f.eager_calls for f in self.by_class.values())

    @property
    def fullgraph_classes(self) -> list[str]:
        """The classes that compiled into one graph each (the others broke it)."""
        return sorted(c.__name__ for c, f in self.by_class.items() if f.fullgraph)

    def remove(self) -> None:
        """Put every block's eager `forward` back. Idempotent."""
        self._hooks.remove()


def repeated_blocks(model: torch.nn.Module, fallback: Iterable[torch.nn.Module] = ()) -> list[torch.nn.Module]:
    """The modules diffusers' `compile_repeated_blocks` would compile (classes named in `_repeated_blocks`),
    else `fallback` (the block lists the plan streams)."""
    names = set(getattr(model, "_repeated_blocks", None) or ())
    found = [m for m in model.modules() if type(m).__name__ in names] if names else []
    return found or list(fallback)
