"""`--compile` at run time: the denoisers' repeated blocks compiled (or not) for each request, and what it cost.

The compiled forwards (offload/block_compile.py) are installed for a request the choice turns on and removed
for one it turns off (auto may differ per request); Dynamo keeps its graphs across both, so turning it on
again costs nothing. The compile itself happens in the first step of the first request at a shape; its
seconds, Dynamo's compile, recompile and graph-break counts are this request's `CompileOutcome`, and the
measured seconds go into the signature's record (engine/planning/compile_record.py) for the next forecast.

The compile's device workspace (autotuning and benchmarking scratch, the tracing's own tensors) is measured the
same way: the first step's allocator peak, where every graph compiles, above the later steps' peak, where the
same graphs run compiled (`compile_workspace`). The record keeps the largest seen, and the next forecast and
`--vram-budget` hold that back instead of the estimate.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch

from ...offload.block_compile import CompiledBlocks, CompileSettings, CompileWatch, repeated_blocks
from ...offload.compile_warmup import CompileWarmup
from ..planning.compile_choice import CompileForecast, DeviceSupport
from ..planning.compile_plan import compile_forecast, plan_signature
from ..planning.compile_record import inductor_cache_dir, save_measured
from ..planning.plan import Plan
from ..planning.request_forecast import RequestForecast
from ..planning.request_profile import device_name


@dataclass(frozen=True)
class CompileOutcome:
    """One request's compile phase: whether it ran compiled, the forecast's word, and Dynamo's counts."""

    on: bool
    why: str
    expect: str | None
    seconds: float
    forecast_seconds: float
    compiles: int
    recompiles: int
    graph_breaks: int
    lines: tuple[str, ...] = ()
    workspace_bytes: int | None = None  # measured in this request (`compile_workspace`); None: not measured

    def as_dict(self) -> dict[str, Any]:
        return {"on": self.on, "why": self.why, "expect": self.expect, "seconds": round(self.seconds, 3),
                "forecast_seconds": round(self.forecast_seconds, 3), "compiles": self.compiles,
                "recompiles": self.recompiles, "graph_breaks": self.graph_breaks,
                "workspace_bytes": self.workspace_bytes}


def compile_workspace(first_step_peak: int | None, later_steps_peak: int | None) -> int | None:
    """The device bytes a compiling first step held above the compiled steps after it (allocator peaks, the same
    weights and ring resident in both); None where either is unknown (off CUDA, or a one-step request)."""
    if first_step_peak is None or later_steps_peak is None:
        return None
    return max(0, first_step_peak - later_steps_peak)


def device_support(device: torch.device) -> DeviceSupport:
    """CUDA, Triton and the compute capability of `device`."""
    if device.type != "cuda":
        return DeviceSupport(cuda=False, triton=False, capability=None)
    try:
        import triton  # noqa: F401
        has_triton = True
    except ImportError:
        has_triton = False
    return DeviceSupport(cuda=True, triton=has_triton, capability=torch.cuda.get_device_capability(device))


def use_tool_cache() -> None:
    """Inductor's and Triton's caches under the tool's cache dir (unless the operator set them): the second
    start is warm, and the directory is the tool's own (docs/security.md).

    Torch writes its default (`/tmp/torchinductor_<user>`) into `TORCHINDUCTOR_CACHE_DIR` the first time anything
    asks for its cache dir, and importing diffusers' pipelines does (through `torch._dynamo`): a value equal to
    that default is torch's, not the operator's, and is replaced; any other value is kept. Called before the
    first compile of the process (Inductor reads the variable at each use)."""
    root = inductor_cache_dir()
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or _is_torch_default(current):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root)
    os.environ.setdefault("TRITON_CACHE_DIR", str(root / "triton"))


def _is_torch_default(path: str) -> bool:
    """Whether `path` is the cache dir torch picks when none is set (an older torch without the helper: never)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        return False
    return os.path.abspath(path) == os.path.abspath(default_cache_dir())


def start_warmup(asked: str, backend: str, device: torch.device) -> CompileWarmup | None:
    """The compile stack's start-up in a thread beside the load (offload/compile_warmup.py), where a request may
    compile: `regional`, or `auto` on a device that supports it (auto is off elsewhere). Inductor's cache is the
    tool's before it starts."""
    if asked == "off" or (asked == "auto" and device_support(device).why_not):
        return None
    use_tool_cache()
    return CompileWarmup(device, backend)


class RegionalCompile:
    """One engine's regional compile: its blocks, its settings, and the signatures it compiled in this process."""

    def __init__(self, asked: str, backend: str, denoisers: list[torch.nn.Module], device: torch.device,
                 warmup: CompileWarmup | None = None) -> None:
        self.asked = asked
        self.warmup = warmup  # the compile stack's start-up, begun while the model loaded (`start_warmup`)
        self.settings = CompileSettings(backend=backend)
        self.device = device
        self.device_name = device_name(device)  # the records' key, as `plan` names the device (NVML's GPU name)
        self.support = device_support(device)
        self._blocks = [b for d in denoisers for b in repeated_blocks(d, _block_lists(d))]
        self._compiled: CompiledBlocks | None = None
        self._warm: set[str] = set()  # signatures compiled in this process: no compile phase at all
        use_tool_cache()
        CompileWatch.watch()

    @property
    def classes(self) -> list[str]:
        return sorted({type(b).__name__ for b in self._blocks})

    def forecast(self, plan: Plan, forecast: RequestForecast | None, steps: int,
                 notes: list[str] | None = None) -> CompileForecast:
        return compile_forecast(plan, forecast, self.asked, self.support, steps=steps, device_name=self.device_name,
                                backend=self.settings.backend, notes=notes)

    def begin(self, decision: CompileForecast) -> tuple[Any, ...]:
        """Install (or remove) the compiled forwards for this request; returns the mark `finish` needs. The
        load's start-up is joined first (one compile at a time), its wait part of this request's phase."""
        waited = self.warmup.wait() if self.warmup is not None else 0.0
        self.warmup = None
        if decision.on and self._compiled is None and self._blocks:
            self._compiled = CompiledBlocks(self._blocks, self.settings)
        elif not decision.on and self._compiled is not None:
            self._compiled.remove()
            self._compiled = None
        return (CompileWatch.snapshot(), decision, waited)

    def finish(self, mark: tuple[Any, ...], plan: Plan, size_label: str,
               workspace_bytes: int | None = None) -> CompileOutcome:
        """This request's compile phase from Dynamo's counts since `begin`; a measured phase is recorded, with
        `workspace_bytes` (`compile_workspace` of its steps) where this request compiled."""
        before, decision, waited = mark
        done = CompileWatch.snapshot() - before
        seconds = done.seconds + (waited if decision.on else 0.0)  # a request that ran eagerly waited for no compile
        sig = plan_signature(plan, size_label, self.device_name, self.settings.backend)
        expect = decision.expect
        measured: int | None = None
        if decision.on and sig in self._warm:
            expect = "in memory"
        elif decision.on and done.compiles:
            self._warm.add(sig)
            measured = workspace_bytes
            with contextlib.suppress(OSError):  # a read-only cache dir: the next forecast stays estimated
                save_measured(sig, seconds, cold=decision.expect == "cold", workspace_bytes=measured)
        return CompileOutcome(on=decision.on, why=decision.why, expect=expect, seconds=seconds,
                              forecast_seconds=decision.seconds if expect in ("cold", "warm") else 0.0,
                              compiles=done.compiles, recompiles=done.recompiles, graph_breaks=done.graph_breaks,
                              lines=tuple(decision.lines()), workspace_bytes=measured)

    def close(self) -> None:
        if self.warmup is not None:  # never left compiling past the engine
            self.warmup.wait()
            self.warmup = None
        if self._compiled is not None:
            self._compiled.remove()
            self._compiled = None


def _block_lists(module: torch.nn.Module) -> list[torch.nn.Module]:
    """A denoiser's block-list modules (a fallback where the class names no `_repeated_blocks`)."""
    found: list[torch.nn.Module] = []
    for name in ("transformer_blocks", "single_transformer_blocks", "blocks", "layers"):
        value = getattr(module, name, None)
        if isinstance(value, torch.nn.ModuleList):
            found.extend(value)
    return found


def begin_compile(compile_: RegionalCompile | None, engine: Any, request: Any, forecast: RequestForecast | None,
                  request_id: int) -> tuple[Any, ...] | None:
    """Before a request: decide, install or remove the compiled forwards, and say so live (a log line)."""
    if compile_ is None or engine.plan is None:
        return None
    from ..events import LogEvent

    notes: list[str] = []
    decision = compile_.forecast(engine.plan, forecast, request.steps or 1, notes)
    warmup = compile_.warmup
    mark = compile_.begin(decision)
    if warmup is not None:
        notes.append(warmup_line(warmup, mark[2]))
    for line in [*notes, *decision.lines()]:
        engine.bus.publish(LogEvent(level="info", message=f"request {request_id}: {line}"))
    return mark


def warmup_line(warmup: CompileWarmup, waited: float) -> str:
    """What the load's compile start-up cost this request: nothing, or the wait (and a failure, if it failed)."""
    took = warmup.seconds or 0.0
    line = f"compile start-up {took:.1f} s beside the load" + (f", {waited:.1f} s of it waited for" if waited >= 0.05
                                                               else ", nothing waited for")
    return f"{line} (it failed: {warmup.error})" if warmup.error else line


def finish_compile(compile_: RegionalCompile | None, mark: tuple[Any, ...] | None, engine: Any, request: Any,
                   request_id: int, run: Any = None) -> CompileOutcome | None:
    """After a request: its compile phase, published as a `CompilePhase` event. `run`: the request's
    `RunOutput`, whose step peaks give the compile workspace."""
    if compile_ is None or mark is None or engine.plan is None:
        return None
    from ..events import CompilePhase
    from .profiler import request_size

    workspace = compile_workspace(getattr(run, "first_step_peak", None), getattr(run, "later_steps_peak", None))
    outcome = compile_.finish(mark, engine.plan, request_size(request).label(), workspace)
    engine.bus.publish(CompilePhase(request_id=request_id, on=outcome.on, why=outcome.why, expect=outcome.expect,
                                    seconds=outcome.seconds, forecast_seconds=outcome.forecast_seconds,
                                    compiles=outcome.compiles, recompiles=outcome.recompiles,
                                    graph_breaks=outcome.graph_breaks, workspace_bytes=outcome.workspace_bytes))
    return outcome


def ran_compiled(mark: tuple[Any, ...] | None) -> bool:
    """Whether the request `begin_compile` marked ran with its blocks compiled (its step times are not eager's)."""
    return mark is not None and bool(mark[1].on)
