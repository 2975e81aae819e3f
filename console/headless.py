"""`omni-console run`: check every flag, load, generate, write the image or video, print what happened.

Order matters to the operator: flags that need no model (policy, rate, device, output path, --param
syntax, --fps) are checked first, then the model is discovered (configs and safetensors headers only)
and the request is checked against it (sizes, the pipeline's call signature, the output's suffix and
every file it would write) — all before a single weight loads. Load and generation run on a worker
thread under an `InterruptGuard`, so Ctrl+C always ends the same way (one line, exit 130).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rich.console import Console

from ..engine.api import EngineHandle, OffloadPolicy, checks, plain, probes, service, writes
from ..engine.errors import OPERATOR_ERRORS, ConfigError
from .args import budget_from_args, layout_from_args, policy_from_args, ram_budget_from_args, resolve_model_path
from .compile_flags import compile_options
from .event_text import one_line as _one_line
from .interrupts import Interrupted, InterruptGuard
from .lora_flags import lora_options
from .request_defaults import default_request
from .run_flags import OptionFlags, parse_option_flags
from .run_progress import RunProgress
from .run_request import REQUEST_FLAGS, checked_request
from .run_text import print_report
from .telemetry_text import describe_snapshot

if TYPE_CHECKING:
    import torch

__all__ = ["run_headless", "default_request", "check_run_flags", "RunFlags",
           "REQUEST_FLAGS"]

EXIT_FAILED = 1


@dataclass(frozen=True, slots=True)
class RunFlags:
    """The `run` flags that need no model, checked."""

    policy: OffloadPolicy
    budget: int | None
    telemetry_hz: float
    device: torch.device | None
    options: OptionFlags  # --param values and --fps
    ram_budget: int | None = None  # --ram-budget: the host tiers are planned within it (engine/planning/ram_plan.py)


def check_run_flags(args: argparse.Namespace) -> RunFlags:
    """Everything about `run` that can be refused without reading the model (ConfigError, one line)."""
    policy = policy_from_args(args)
    budget = budget_from_args(args)
    try:
        hz = probes.validate_hz(args.telemetry_hz)
    except ValueError as exc:
        raise ConfigError(f"--telemetry-hz: {exc}") from None
    device = probes.parse_device(args.device)
    options = parse_option_flags(args)
    checks.check_output_place(args.output)  # which files it writes depends on the model: checked after discovery
    return RunFlags(policy, budget, hz, device, options, ram_budget=ram_budget_from_args(args))


def run_headless(args: argparse.Namespace, guard: InterruptGuard | None = None) -> int:
    guard = guard or InterruptGuard()
    flags = check_run_flags(args)
    layout = layout_from_args(args)
    if layout.distributed:
        if args.lora:
            raise ConfigError("--lora with --gpus N > 1: the rank group does not apply LoRAs yet (one GPU does)")
        if getattr(args, "compile", "off") != "off":
            raise ConfigError("--compile with --gpus N > 1: the rank group does not compile yet (one GPU does)")
        from .headless_ranks import run_ranks

        return run_ranks(args, guard, layout, flags)
    # On this (main) thread: building the demo model installs its own signal cleanup, which only the main
    # thread can; a signal meanwhile removes the unfinished build and ends the run (exit_signals).
    model_path = resolve_model_path(args.model)
    guard.check()
    if flags.budget is not None and (flags.device or probes.default_device()).type == "cuda":
        probes.prefer_expandable_segments()  # before CUDA's allocator starts (run_memory)
    engine = guard.run(lambda: service.open_engine(model_path, device=flags.device, variant=args.variant,
                                                   options=replace(service.run_options(flags.budget, flags.ram_budget),
                                                                   **lora_options(args), **compile_options(args))))
    try:
        plan = engine.make_plan(flags.policy)  # policy against the model, before anything is allocated
        steps = checks.schedule_steps(args.steps, flags.options.params)  # a sigmas/timesteps list sets the count
        request = default_request(engine, prompt=args.prompt, steps=steps, height=args.height,
                                  width=args.width, seed=args.seed, guidance=args.guidance, frames=args.frames,
                                  negative_prompt=args.negative_prompt, max_sequence_length=args.max_sequence_length,
                                  image=args.image, params=flags.options.params)
        request = replace(request, cache=flags.options.cache)
        checks.check_cache_support(engine.model, request.cache)  # the family's DiT takes the kind: before load
        run = checked_request(engine.model, request, flags.options, args.output, overwrite=args.overwrite)
        # with a budget, before load: nothing fits is one line and exit 2
        planned = service.plan_run(engine, plan, flags.budget, flags.ram_budget, run.request)
        for line in planned.notes:  # stderr, like all progress: stdout holds only the report
            Console(stderr=True).print(plain(line), markup=False, highlight=False)
        guard.check()
        return _load_generate_report(args, flags, engine, planned, run, guard)
    finally:
        engine.close()


def _load_generate_report(args: argparse.Namespace, flags: RunFlags, engine: EngineHandle,
                          planned: service.RunPlan, run: service.CheckedRun, guard: InterruptGuard) -> int:
    plan = planned.plan
    err = Console(stderr=True)
    progress = RunProgress(engine.bus.subscribe(), err, muted=lambda: guard.interrupted, lock=guard.output_lock)
    sampler = probes.TelemetrySampler(*probes.default_sources(engine.device), bus=engine.bus, hz=flags.telemetry_hz)
    progress.start()
    sampler.start()
    memory = probes.RunMemory.start(engine.device, engine.device_name, flags.budget, planned.overhead)
    # the request goes through the engine's request service; its files are written here, on the main
    # thread, where a signal during the write unwinds it (write_in_caller)
    history = service.History()  # the cache's history.json: this run is kept in it (a bad file: one note, started anew)
    if history.note:
        with guard.output_lock:  # between the progress lines, never inside one
            err.print(plain(f"note: {history.note}"), markup=False, highlight=False, soft_wrap=True)
    queue = service.RequestService(engine, write_in_caller=True, history=history)
    stage, failure, result = "load", None, None
    try:
        load = guard.run(engine.load, planned.policy, guard.cancel, plan.tiers)
        stage = "generation"
        ticket = queue.submit(run)
        outcome = guard.run(queue.wait, ticket, guard.cancel)
        if outcome.state == "failed":
            raise outcome.exception or RuntimeError(outcome.error)
        result = outcome.result
        final = sampler.sample_now(publish=True)
    except Interrupted:
        queue.close()
        raise
    except Exception as exc:  # a load or run failure (a ModelDirError too: loading had begun): one line, exit 1
        what = str(exc) if isinstance(exc, OPERATOR_ERRORS) else f"{type(exc).__name__}: {exc}"
        failure = f"{stage} failed: {_one_line(what)}"
    finally:
        measured = memory.finish(getattr(result, "peak_allocated_bytes", None),
                                 getattr(result, "peak_reserved_bytes", None))
        sampler.close()
        progress.stop.set()
        progress.join()  # its last lines come before the failure's, which must be the last one
    if failure is not None or result is None:
        queue.close()
        _fail(err, failure or "generation failed: no result")
        return EXIT_FAILED
    engine.close()  # the frames are in host memory: release the device before writing and reporting
    guard.check()
    outcome = queue.write(ticket, outcome, before=guard.check)  # Ctrl+C now removes what is being written
    if outcome.state == "failed":
        queue.finish(ticket, outcome)
        queue.close()
        _fail(err, outcome.error)
        return EXIT_FAILED
    writes.pause_point("after-write")
    guard.check()  # Ctrl+C after the write: the line said the output is complete; the exit says 130
    totals = progress.totals
    report = service.run_report(
        model=str(engine.model.path), device=str(engine.device), policy=planned.policy, plan=plan, load=load,
        result=result, ticket=ticket, written=outcome.written,
        memory={**measured, **memory.predicted(result.check, measured["process_peak_bytes"])},
        totals=totals.summary(), events_dropped=progress.sub.dropped,
        telemetry={**totals.telemetry_peaks(), "final": describe_snapshot(final)},
        budget=flags.budget, reasons=planned.reasons, ram=planned.ram, lean=planned.lean)
    queue.finish(ticket, outcome, report)  # kept in the history with its report
    queue.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report, Console(), plan.model.block_kind)
    return 0


def _fail(err: Console, line: str) -> None:
    err.print(f"omni-console: {plain(line)}", markup=False, highlight=False, soft_wrap=True)
