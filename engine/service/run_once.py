"""`run`'s use case: open the model, check and plan one request, load, run it through the request service,
write its outputs and build its report — once, for the CLI. The console only parses flags and prints.

Order matters to the operator: the request and every file it would write are checked against the model,
and the plan against the budget, before a single weight loads. The face's signal guard is handed in as
`CancelPoints` (the engine never imports the console): slow work runs through `points.run` (off the
main thread, so a signal handler runs promptly), `points.check` is called between phases (the guard raises
its own stop there), and `points.cancel` is the event the engine checks at its safe points. Outputs are
written on the calling thread, where a signal during the write unwinds it: never half an output.

The collector is off while the libraries import and the model loads, then on over a frozen model while the
request runs (`running/collector.py`: a full pass inside a step held the GIL for 0.4 s).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ...offload.telemetry import TelemetrySampler, default_sources
from ...offload.telemetry_types import DEFAULT_HZ
from ..engine import default_device
from ..errors import OPERATOR_ERRORS
from ..running.collector import loaded, quiet_until_loaded
from ..running.run_memory import RunMemory, prefer_expandable_segments
from ..running.signal_guard import pause_point
from ..running.step_cache import check_cache_support
from .checks import CALL_NAMES, CheckedRun, Names, check_run
from .event_drain import EventDrain
from .history import History
from .report import run_report
from .run_plan import RunPlan, plan_run, run_options
from .service import RequestService
from .trace import TraceCapture

if TYPE_CHECKING:
    from ...offload.policy import OffloadPolicy
    from .. import events
    from ..handle import EngineHandle
    from ..ranks.rank_layout import RankLayout
    from ..running.runner import GenerateRequest

T = TypeVar("T")


class CancelPoints(Protocol):
    """What a face's signal guard gives the use case (the console's `InterruptGuard` is one)."""

    cancel: threading.Event  # set by the face's first signal: the engine stops at its next safe point

    def check(self) -> None:
        """Between phases: raise the face's own stop if a signal came."""

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` off this thread, waited for (then `check`)."""


class NoSignals:
    """Cancel points for a caller without a signal guard (a benchmark, a test): work runs on this thread."""

    def __init__(self) -> None:
        self.cancel = threading.Event()

    def check(self) -> None:
        return None

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)


@dataclass(frozen=True)
class RunFace:
    """What the face does along the way; `event` is called on the progress thread, `note` on the caller's."""

    event: Callable[[events.Event], None] = lambda _: None  # each engine event, in order (progress lines)
    note: Callable[[str], None] = lambda _: None  # a line about the plan or the history, before the work
    final_lines: Callable[[Any], list[str]] = lambda _: []  # the report's last telemetry sample, as lines


@dataclass(frozen=True)
class RunSpec:
    """One `run`: the model, the policy and the request's output; `request` makes the request for the model
    once it is open (its defaults may depend on it); `names`: the flags to name in a refusal."""

    model: Path
    policy: OffloadPolicy
    output: Path
    request: Callable[[EngineHandle], GenerateRequest]
    overwrite: bool = False
    device: Any = None
    variant: str | None = None
    budget: int | None = None
    ram_budget: int | None = None
    telemetry_hz: float = DEFAULT_HZ
    fps: float | None = None
    names: Names = field(default_factory=lambda: CALL_NAMES)
    open_options: dict[str, Any] = field(default_factory=dict)  # more EngineOptions fields (the LoRAs)
    layout: RankLayout | None = None  # a rank group (`run_ranks`)
    trace: Path | None = None  # --trace: the request's Chrome/Perfetto trace, written after its outputs


@dataclass(frozen=True)
class RunDone:
    """How the run ended: its report, or the one line of its failure (all progress handed on before it)."""

    report: Any = None  # the report's JSON document (one GPU) or a `RanksReport` (a rank group)
    failure: str | None = None
    block_kind: str = "DiT"

    def document(self) -> dict[str, Any]:
        return self.report.model_dump() if hasattr(self.report, "model_dump") else self.report


def run_once(spec: RunSpec, points: CancelPoints, face: RunFace | None = None) -> RunDone:
    """Open, check, plan, load, run, write, report; the engine is closed (its memory released) however it ends.
    Bad input raises ConfigError before anything loads; a failed load, run or write is `RunDone.failure`."""
    from ..api import open_engine

    face = face or RunFace()
    if spec.budget is not None and (spec.device or default_device()).type == "cuda":
        prefer_expandable_segments()  # before CUDA's allocator starts (run_memory)
    options = replace(run_options(spec.budget, spec.ram_budget), **spec.open_options)
    with quiet_until_loaded():
        engine = points.run(lambda: open_engine(spec.model, device=spec.device, variant=spec.variant,
                                                options=options))
        try:
            planned, run = check_and_plan(engine, spec)
            for line in planned.notes:
                face.note(line)
            points.check()
            return _serve(engine, spec, planned, run, points, face)
        finally:
            engine.close()  # its collection skips the frozen model: the process usually ends next


def check_and_plan(engine: EngineHandle, spec: RunSpec) -> tuple[RunPlan, CheckedRun]:
    """The policy, the request and its output against the model, then the plan for it: all before load."""
    plan = engine.make_plan(spec.policy)
    request = spec.request(engine)
    check_cache_support(engine.model, request.cache)  # the family's DiT takes the kind: before load
    run = check_run(engine.model, request, spec.output, overwrite=spec.overwrite, fps=spec.fps, names=spec.names)
    return plan_run(engine, plan, spec.budget, spec.ram_budget, run.request), run  # nothing fits: exit 2


def _serve(engine: EngineHandle, spec: RunSpec, planned: RunPlan, run: CheckedRun, points: CancelPoints,
           face: RunFace) -> RunDone:
    plan = planned.plan
    drain = EventDrain(engine.bus.subscribe(), face.event)
    # NVML's process list is walked by RunMemory's peak meter (20 Hz) for the report; the sampler walks it again only
    # for a trace's counter track: each walk is driver work beside the load's page-locking and copies (time to ready)
    sampler = TelemetrySampler(*default_sources(engine.device, process=spec.trace is not None), bus=engine.bus,
                               hz=spec.telemetry_hz)
    drain.start()
    sampler.start()
    memory = RunMemory.start(engine.device, engine.device_name, spec.budget, planned.overhead)
    history = History()  # the cache's history.json: this run is kept in it (a bad file: one note, started anew)
    if history.note:
        face.note(f"note: {history.note}")
    # written here, on the caller's thread, where a signal during the write unwinds it (write_in_caller)
    queue = RequestService(engine, write_in_caller=True, history=history)
    trace = TraceCapture(engine.bus) if spec.trace is not None else None
    stage, failure, result = "load", None, None
    try:
        load = points.run(engine.load, planned.policy, points.cancel, plan.tiers)
        loaded()  # the collector on again, over a frozen model (running/collector.py)
        stage = "generation"
        ticket = queue.submit(run)
        outcome = points.run(queue.wait, ticket, points.cancel)
        if outcome.state == "failed":
            raise outcome.exception or RuntimeError(outcome.error)
        result = outcome.result
        final = sampler.sample_now(publish=True)
    except Exception as exc:  # a load or run failure (a ModelDirError too: loading had begun): one line, exit 1
        what = str(exc) if isinstance(exc, OPERATOR_ERRORS) else f"{type(exc).__name__}: {exc}"
        failure = f"{stage} failed: {_one_line(what)}"
    except BaseException:  # the face's stop (a signal): nothing more runs
        queue.close()
        raise
    finally:
        measured = memory.finish(getattr(result, "peak_allocated_bytes", None),
                                 getattr(result, "peak_reserved_bytes", None))
        sampler.close()
        drain.finish()  # its last events come before the failure's line, which must be the last one
    if failure is not None or result is None:
        queue.close()
        return RunDone(failure=failure or "generation failed: no result")
    engine.close()  # the frames are in host memory: release the device before writing and reporting
    points.check()
    outcome = queue.write(ticket, outcome, before=points.check)  # a signal now removes what is being written
    if outcome.state == "failed":
        queue.finish(ticket, outcome)
        queue.close()
        return RunDone(failure=outcome.error)
    pause_point("after-write")
    points.check()  # a signal after the write: the line says the output is complete
    if trace is not None:  # beside the outputs (engine/service/trace.py); an existing file is never replaced
        try:
            face.note(trace.write(spec.trace, overwrite=spec.overwrite))
        except OSError as exc:
            queue.close()
            return RunDone(failure=f"trace not written: {_one_line(str(exc))}")
    totals = drain.totals
    report = run_report(
        model=str(engine.model.path), device=str(engine.device), policy=planned.policy, plan=plan, load=load,
        result=result, ticket=ticket, written=outcome.written,
        memory={**measured, **memory.predicted(result.check, measured["process_peak_bytes"])},
        totals=totals.summary(), events_dropped=drain.sub.dropped,
        telemetry={**totals.telemetry_peaks(), "final": face.final_lines(final)},
        budget=spec.budget, reasons=planned.reasons, ram=planned.ram, lean=planned.lean)
    queue.finish(ticket, outcome, report)  # kept in the history with its report
    queue.close()
    return RunDone(report=report, block_kind=plan.model.block_kind)


def _one_line(text: str) -> str:
    """The message's first line; where it only names the error ("ImportError:"), the next one joined to it."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
