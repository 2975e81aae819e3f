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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..engine.api import (
    EngineHandle,
    EngineOptions,
    History,
    OffloadPolicy,
    RequestService,
    RunMemory,
    TelemetrySampler,
    check_output_place,
    default_device,
    default_sources,
    loads_live,
    open_engine,
    parse_device,
    pause_point,
    plain,
    plan_for,
    prefer_expandable_segments,
    request_size,
    run_report,
    schedule_steps,
    validate_hz,
)
from ..engine.errors import OPERATOR_ERRORS, ConfigError
from ..offload.units import copied_text, format_bytes, format_rate, format_seconds
from .args import budget_from_args, layout_from_args, policy_from_args, ram_budget_from_args, resolve_model_path
from .event_text import PHASE_LABELS
from .event_text import one_line as _one_line
from .host_check import host_check_row
from .interrupts import Interrupted, InterruptGuard
from .request_defaults import default_request
from .run_flags import OptionFlags, parse_option_flags
from .run_progress import RunProgress
from .run_request import REQUEST_FLAGS, CheckedRun, checked_request
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
    reasons: list[str] = field(default_factory=list)  # --vram-budget's decisions, one line each
    overhead: Any = None  # --vram-budget: the device's footprint outside torch (engine.planning.device_footprint)
    lean: list[str] = field(default_factory=list)  # lean phases in effect, each with its cost (engine/planning/lean.py)
    ram_budget: int | None = None  # --ram-budget: the host tiers are planned within it (engine/planning/ram_plan.py)
    ram: Any = None  # --ram-budget's answer (engine/planning/ram_plan.RamPlan)


def check_run_flags(args: argparse.Namespace) -> RunFlags:
    """Everything about `run` that can be refused without reading the model (ConfigError, one line)."""
    policy = policy_from_args(args)
    budget = budget_from_args(args)
    try:
        hz = validate_hz(args.telemetry_hz)
    except ValueError as exc:
        raise ConfigError(f"--telemetry-hz: {exc}") from None
    device = parse_device(args.device)
    options = parse_option_flags(args)
    check_output_place(args.output)  # which files it writes depends on the model: checked after discovery
    return RunFlags(policy, budget, hz, device, options, ram_budget=ram_budget_from_args(args))


def run_headless(args: argparse.Namespace, guard: InterruptGuard | None = None) -> int:
    guard = guard or InterruptGuard()
    flags = check_run_flags(args)
    layout = layout_from_args(args)
    if layout.distributed:
        from .headless_ranks import run_ranks

        return run_ranks(args, guard, layout, flags)
    # On this (main) thread: building the demo model installs its own signal cleanup, which only the main
    # thread can; a signal meanwhile removes the unfinished build and ends the run (exit_signals).
    model_path = resolve_model_path(args.model)
    guard.check()
    if flags.budget is not None and (flags.device or default_device()).type == "cuda":
        prefer_expandable_segments()  # before CUDA's allocator starts (run_memory)
    # with a budget, live re-plan: an out-of-memory step-down can then move resident blocks (oom_guard)
    engine = guard.run(lambda: open_engine(model_path, device=flags.device, variant=args.variant,
                                           options=EngineOptions(live_replan=_live(flags))))
    try:
        plan = engine.make_plan(flags.policy)  # policy against the model, before anything is allocated
        steps = schedule_steps(args.steps, flags.options.params)  # a sigmas/timesteps list sets the count
        request = default_request(engine, prompt=args.prompt, steps=steps, height=args.height,
                                  width=args.width, seed=args.seed, guidance=args.guidance, frames=args.frames,
                                  negative_prompt=args.negative_prompt, max_sequence_length=args.max_sequence_length,
                                  image=args.image, params=flags.options.params)
        run = checked_request(engine.model, request, flags.options, args.output, overwrite=args.overwrite)
        # with a budget, before load: nothing fits is one line and exit 2
        planned = plan_for(engine, plan, flags.budget, request_size(run.request), ram_budget=flags.ram_budget,
                           live=_live(flags))
        plan = planned.plan
        if planned.auto is not None:
            flags = replace(flags, policy=plan.policy, overhead=planned.auto.overhead)
            flags.reasons.extend(planned.reasons)
            for line in planned.reasons:  # stderr, like all progress: stdout holds only the report
                Console(stderr=True).print(plain(f"--vram-budget: {line}"), markup=False, highlight=False)
        flags = replace(flags, ram=planned.ram)
        for line in planned.ram.reasons if planned.ram else ():
            Console(stderr=True).print(plain(f"--ram-budget: {line}"), markup=False, highlight=False)
        flags.lean.extend(_lean_lines(planned.forecast, flags.budget is None))
        guard.check()
        return _load_generate_report(args, flags, engine, plan, run, guard)
    finally:
        engine.close()


def _live(flags: RunFlags) -> bool:
    """Whether `run` loads with live re-plan masters (the engine's one rule, `loads_live`)."""
    return loads_live(flags.budget, flags.ram_budget)


def _lean_lines(forecast: Any, say: bool) -> list[str]:
    """The lean phases the plan applies (its forecast's), each with its cost; printed (stderr) unless
    the budget's reasons already said them."""
    lines = [c.line for c in forecast.lean]
    for line in lines if say else ():
        Console(stderr=True).print(plain(f"lean phase: {line}"), markup=False, highlight=False)
    return lines


def _load_generate_report(args: argparse.Namespace, flags: RunFlags, engine: EngineHandle, plan: Any,
                          run: CheckedRun, guard: InterruptGuard) -> int:
    err = Console(stderr=True)
    progress = RunProgress(engine.bus.subscribe(), err, muted=lambda: guard.interrupted, lock=guard.output_lock)
    sampler = TelemetrySampler(*default_sources(engine.device), bus=engine.bus, hz=flags.telemetry_hz)
    progress.start()
    sampler.start()
    memory = RunMemory.start(engine.device, engine.device_name, flags.budget, flags.overhead)
    # the request goes through the engine's request service; its files are written here, on the main
    # thread, where a signal during the write unwinds it (write_in_caller)
    history = History()  # the cache's history.json: this run is kept in it (a bad file: one note, started anew)
    if history.note:
        with guard.output_lock:  # between the progress lines, never inside one
            err.print(plain(f"note: {history.note}"), markup=False, highlight=False, soft_wrap=True)
    service = RequestService(engine, write_in_caller=True, history=history)
    stage, failure, result = "load", None, None
    try:
        load = guard.run(engine.load, flags.policy, guard.cancel, plan.tiers)
        stage = "generation"
        ticket = service.submit(run)
        outcome = guard.run(service.wait, ticket, guard.cancel)
        if outcome.state == "failed":
            raise outcome.exception or RuntimeError(outcome.error)
        result = outcome.result
        final = sampler.sample_now(publish=True)
    except Interrupted:
        service.close()
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
        service.close()
        _fail(err, failure or "generation failed: no result")
        return EXIT_FAILED
    engine.close()  # the frames are in host memory: release the device before writing and reporting
    guard.check()
    outcome = service.write(ticket, outcome, before=guard.check)  # Ctrl+C now removes what is being written
    if outcome.state == "failed":
        service.finish(ticket, outcome)
        service.close()
        _fail(err, outcome.error)
        return EXIT_FAILED
    pause_point("after-write")
    guard.check()  # Ctrl+C after the write: the line said the output is complete; the exit says 130
    totals = progress.totals
    report = run_report(model=str(engine.model.path), device=str(engine.device), policy=flags.policy, plan=plan,
                        load=load, result=result, ticket=ticket, written=outcome.written,
                        memory={**measured, **memory.predicted(result.check, measured["process_peak_bytes"])},
                        totals=totals.summary(), events_dropped=progress.sub.dropped,
                        telemetry={**totals.telemetry_peaks(), "final": describe_snapshot(final)},
                        budget=flags.budget, reasons=flags.reasons, ram=flags.ram, lean=flags.lean)
    service.finish(ticket, outcome, report)  # kept in the history with its report
    service.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report, Console(), plan.model.block_kind)
    return 0


def _fail(err: Console, line: str) -> None:
    err.print(f"omni-console: {plain(line)}", markup=False, highlight=False, soft_wrap=True)


class _PlainTable(Table):
    """A table whose cells are shown as written: a path or name from data is never markup or control."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:  # type: ignore[override]
        super().add_row(*(Text(plain(r)) if isinstance(r, str) else r for r in renderables), **kwargs)


def _print_report(r: dict[str, Any], console: Console, kind: str = "DiT") -> None:
    table = _PlainTable(title=Text(plain(f"run — {r['model']} on {r['device']}")), show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    on_cpu = r["device"].startswith("cpu")  # no device link: copies are host memory copies, nothing pinned
    table.add_row("load time", format_seconds(r["load_seconds"]))
    for key, seconds in r.get("load_phases", {}).items():
        table.add_row(f"  {key}", format_seconds(seconds))
    table.add_row("pinned host memory", "none (CPU)" if on_cpu else format_bytes(r["pinned_bytes"]))
    table.add_row("request time", format_seconds(r["request_seconds"]))
    for key, seconds in r["phases"].items():
        table.add_row(f"  {PHASE_LABELS.get(key, key)}", format_seconds(seconds))
    if "vae_decode" in r["phases"]:
        table.add_row("  VAE decode peak (torch)", format_bytes(r["vae_decode_peak_bytes"]))
    latents = f" (latents {'x'.join(map(str, r['latent_shape']))})" if r["latent_shape"] else ""
    table.add_row("frames", f"{r['frames']}{latents}")
    if r["is_video"]:
        table.add_row("frame rate", f"{r['fps']:g} fps ({r['fps_source']})")
    if r["copied_bytes_per_forward"]:  # the plan names the weights; the copies carry padding too
        table.add_row(f"copied per {kind} forward",
                      copied_text(r["copied_bytes_per_forward"], r["forecast"]["streamed_bytes_per_forward"]))
    for s in r["steps"]:
        table.add_row(f"step {s['step']}", f"{format_seconds(s['wall_s'])} (stall {format_seconds(s['stall_s'])}, "
                                           f"copied {format_bytes(s['h2d_bytes'])})")
    st = r["staging"]
    if on_cpu:
        table.add_row("host copies (CPU: no device link)", f"{st['h2d_transfers']}, {format_bytes(st['h2d_bytes'])}")
    else:
        table.add_row("host→device transfers", f"{st['h2d_transfers']} ({st['sync_transfers']} synchronous)")
        table.add_row("host→device bytes", format_bytes(st["h2d_bytes"]))
        table.add_row("host→device bandwidth (mean)", format_rate(st["h2d_bytes_per_s"]))
    table.add_row("peak allocated (torch)", format_bytes(r["peak_allocated_bytes"]))
    if not on_cpu:
        table.add_row("device memory of the process (NVML peak)", format_bytes(r["process_peak_bytes"])
                      if r["process_peak_bytes"] is not None else f"N/A: {r['process_peak_note']}")
        if r.get("predicted_process_peak_bytes") is not None:
            error = r["process_peak_error"]
            table.add_row("  forecast (allocated + context + margin)",
                          format_bytes(r["predicted_process_peak_bytes"])
                          + (f" ({error * 100:+.1f}%, context {r['context_source']})" if error is not None else ""))
    if r["allocator_cap_bytes"] is not None:
        table.add_row("allocator cap (budget − CUDA context)", format_bytes(r["allocator_cap_bytes"]))
    for s in r["oom_step_downs"]:
        table.add_row(f"out of memory in {PHASE_LABELS.get(s['phase'], s['phase'])}", s["action"])
    check = r.get("forecast_check")
    if check:
        rows = (("step", "predicted_step_s", "measured_step_s", format_seconds),
                ("peak", "predicted_peak_bytes", "measured_peak_bytes", format_bytes))
        for name, predicted_key, measured_key, shown in rows:
            predicted, measured, error = check[predicted_key], check[measured_key], check[f"{name}_error"]
            if measured is None:  # a CPU has no device allocator: there is no peak to predict or check
                text = "not measurable on this device"
            elif predicted is None:
                text = "no forecast yet (cached for the next run)"
            elif error is None:
                text = f"{shown(predicted)} (not measurable here)"
            else:
                text = f"{shown(predicted)} vs {shown(measured)} ({error * 100:+.1f}%, {check[f'{name}_source']})"
            table.add_row(f"{name}: forecast vs measured", text)
    table.add_row("cache decisions", f"{r['cache_decisions_total']} ({r['cache_releases']} releases)")
    t = r["telemetry"]
    table.add_row("telemetry samples", str(t["samples"]))
    table.add_row("peak torch reserved / NVML used", f"{format_bytes(t['torch_reserved_peak'])} / "
                                                     f"{format_bytes(t['nvml_used_peak'])}")
    if on_cpu:
        table.add_row("peak RSS (host)", format_bytes(t["host_rss_peak"]))
    else:
        table.add_row("peak RSS / pinned (host)",
                      f"{format_bytes(t['host_rss_peak'])} / {format_bytes(t['pinned_peak'])}")
    if (host := host_check_row(r)) is not None:
        table.add_row(*host)
    if r["events_dropped"]:
        table.add_row("events dropped (totals are partial)", str(r["events_dropped"]))
    console.print(table)
    console.print("\n".join(plain(line) for line in t["final"]), markup=False, highlight=False)
    # after the table, unwrapped: paths an operator copies
    console.print(plain(f"wrote {_files_line(r['files'])}"), markup=False, highlight=False, soft_wrap=True)
    for note in r["notes"]:
        console.print(plain(f"note: {note}"), markup=False, highlight=False, soft_wrap=True)


def _files_line(files: list[str]) -> str:
    if len(files) <= 2:
        return ", ".join(files) or "nothing"
    return f"{len(files)} files: {files[0]} … {files[-1]}"
