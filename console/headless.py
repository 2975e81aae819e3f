"""`omni-console run`: the flags in, the engine's `run` use case over its request service, the report out.

The flags that need no model (policy, rate, device, output path, --param syntax, --fps) are checked here,
first; the engine (`service.run_once`, or `service.run_ranks` with --gpus N) then checks the request against
the model and plans it before a weight loads, loads, runs, writes and builds the report. The console keeps
the signal guard (`InterruptGuard`: Ctrl+C is one line, exit 130), the progress lines on stderr and the report
on stdout.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rich.console import Console

from ..engine.api import EngineHandle, GenerateRequest, OffloadPolicy, checks, probes, service
from ..engine.errors import ConfigError
from .args import (
    budget_from_args,
    layout_from_args,
    policy_from_args,
    ram_budget_from_args,
    resolve_model_path,
)
from .compile_flags import compile_options
from .interrupts import InterruptGuard
from .lora_flags import lora_options
from .request_defaults import default_request, run_prompt_and_steps
from .run_flags import OptionFlags, parse_option_flags
from .run_progress import ProgressLines, engine_line, rank_line
from .run_text import print_report
from .telemetry_text import describe_snapshot

if TYPE_CHECKING:
    import torch

__all__ = ["run_headless", "default_request", "check_run_flags", "RunFlags"]

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
    if args.trace is not None:  # --trace: checked like an output, before anything loads
        checks.check_trace_place(args.trace, overwrite=args.overwrite, output=args.output)
    layout = layout_from_args(args)
    if layout.distributed:
        from .headless_ranks import check_rank_flags

        check_rank_flags(args, flags, layout)
    # On this (main) thread: building the demo model installs its own signal cleanup, which only the main
    # thread can; a signal meanwhile removes the unfinished build and ends the run (exit_signals).
    model_path = resolve_model_path(args.model)
    guard.check()
    options = flags.options

    def request(engine: EngineHandle) -> GenerateRequest:  # the demo's defaults need the model
        prompt, steps = run_prompt_and_steps(engine.model.pipeline_class, args.prompt, args.steps, options.params)
        made = default_request(engine, prompt=prompt, steps=steps, height=args.height, width=args.width,
                               seed=args.seed, guidance=args.guidance, frames=args.frames,
                               negative_prompt=args.negative_prompt, max_sequence_length=args.max_sequence_length,
                               image=args.image, params=options.params)
        return replace(made, cache=options.cache)

    spec = service.RunSpec(model=model_path, policy=flags.policy, output=args.output, request=request,
                           overwrite=args.overwrite, device=flags.device, variant=args.variant, budget=flags.budget,
                           ram_budget=flags.ram_budget, telemetry_hz=flags.telemetry_hz, fps=options.fps,
                           open_options={**lora_options(args), **compile_options(args)},
                           layout=layout if layout.distributed else None, trace=args.trace)
    lines = ProgressLines(Console(stderr=True), guard, rank_line if layout.distributed else engine_line)
    face = service.RunFace(event=lines.event, note=lines.say, final_lines=describe_snapshot)
    done = (service.run_ranks if layout.distributed else service.run_once)(spec, guard, face)
    if done.failure is not None:  # every progress line is out: this one is the last
        lines.say(f"omni-console: {done.failure}")
        return EXIT_FAILED
    if args.json:
        print(json.dumps(done.document(), indent=2))
    elif layout.distributed:
        from .rank_text import print_ranks_report

        print_ranks_report(done.report, Console())
    else:
        print_report(done.report, Console(), done.block_kind)
    return 0
