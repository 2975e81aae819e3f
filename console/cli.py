"""`omni-console` command line: the console app (default), `plan`, `run`, `demo-model`.

Errors the operator can fix print one line and exit 2 — no traceback, not even argparse's usage
block. Ctrl+C prints one line and exits 130.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" or (sys.argv and sys.argv[0].rsplit("/", 1)[-1] == "omni-console"):
    from .exit_signals import install_early  # the console script: a signal during the imports below is one line

    install_early()

import argparse
import gc
import json
from collections.abc import Sequence

from ..engine.api import plain, planner
from ..engine.errors import OPERATOR_ERRORS, ConfigError
from .cli_parser import EXIT_USAGE, UsageError, build_parser, normalise_argv, refuse_dash_dash_values
from .flag_types import check_cache_dir, short_words
from .lora_flags import lora_lines


def cmd_plan(args: argparse.Namespace) -> int:
    from ..engine.api import RequestSize, checks, models, writes

    writes.pause_point("imports")
    from .args import budget_from_args, layout_from_args, policy_from_args, ram_budget_from_args, resolve_model_path
    from .run_flags import check_device_name, check_sizes

    policy = policy_from_args(args)  # build-time checks first: no disk access for a bad flag
    budget = budget_from_args(args)
    ram_budget = ram_budget_from_args(args)
    cache = checks.parse_cache(args.cache)
    check_device_name(args.device)
    check_sizes(args)  # as `run` checks them, in the same words
    layout = layout_from_args(args)
    size = RequestSize(height=args.height, width=args.width, frames=args.frames,
                       max_sequence_length=args.max_sequence_length, guidance=args.guidance)
    model = models.discover_model(resolve_model_path(args.model), args.variant)
    from .plan_request import check_plan_request

    check_plan_request(model, size)  # as `run` would refuse it, with its line
    if cache is not None:  # diffusers takes the kind for this family (imports diffusers: only with --cache)
        from ..engine.api import checks

        checks.check_cache_support(model, cache)
    loras: list = []
    if args.lora:  # as `run` refuses a bad one: before anything loads (reading them imports torch)
        from ..engine.api import checks

        loras = checks.check_loras(model, tuple(args.lora))
    device = planner.device_name_for_plan(args.device)
    planned = planner.plan_for(model, policy, budget, size, device, layout,  # the layout checked, then the budgets
                       ram_budget=ram_budget, file_masters=True,  # as `run` loads: no pinned copy of the device's
                       lora_modules=[m for f in loras for m in f.modules], lora_mode=args.lora_mode)
    plan, forecast, reasons, ranks = planned.plan, planned.forecast, planned.reasons, planned.ranks
    from ..engine.api import checks

    checks.check_fits_host(forecast, "cpu" if device == "cpu" else "cuda")  # as `run` refuses it, with its line
    cache_range = None
    if cache is not None:  # the step as a range, the hit rate measured here for this setting in it
        cache_range = planner.cache_step_range(cache, plan.model.num_dit_blocks, forecast.step_s,
                                               planner.measured_hits(model.pipeline_class, cache))
    compiled = planner.plan_compile(plan, forecast, args.compile, device, getattr(args, "steps", None),
                                    args.compile_backend) if args.compile != "off" else None
    if args.json:
        document = planner.plan_to_dict(plan, forecast, device, budget, reasons, ranks, planned.ram,
                                        cache_range.document() if cache_range is not None else None, loras=loras,
                                        lora=planned.lora, lora_mode=args.lora_mode)
        if compiled is not None:
            document["compile"] = planner.compile_document(compiled)
        print(json.dumps(document, indent=2))
    else:
        from .plan_view import render_plan

        render_plan(plan, forecast=forecast, reasons=reasons, ranks=ranks, on_cpu=device == "cpu",
                    ram_reasons=planned.ram.reasons if planned.ram else None)
        if cache_range is not None:
            print(plain(cache_range.line))
        for line in lora_lines(loras, args.lora_mode, planned.lora):
            print(line)
        for line in compiled.lines() if compiled is not None else ():
            print(plain(line))
    return 0


def cmd_demo_model(args: argparse.Namespace) -> int:
    from ..engine.api import writes
    from .run_flags import SEED_MAX  # torch-free: a bad seed is answered before the build imports torch

    writes.pause_point("imports")

    if not 0 <= args.seed <= SEED_MAX:
        raise ConfigError(f"--seed {args.seed}: must be between 0 and 2**64-1 ({SEED_MAX})")
    from ..engine.api import models

    path = models.build_demo_model(args.path, seed=args.seed)
    print(f"demo model written to {plain(path)}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .interrupts import InterruptGuard

    with InterruptGuard() as guard:  # before the heavy imports: Ctrl+C from here on is one line, 130
        from ..engine.api import writes
        from .run_flags import precheck_run

        precheck_run(args)  # torch-free: a cheap mistake is answered before the imports below
        writes.pause_point("imports")
        from .headless import run_headless

        return run_headless(args, guard)


def cmd_console(args: argparse.Namespace) -> int:
    from .app_main import run_app

    return run_app(args)


COMMANDS = {"plan": cmd_plan, "demo-model": cmd_demo_model, "run": cmd_run, "console": cmd_console}


def main(argv: Sequence[str] | None = None) -> int:
    from .exit_signals import end, exit_code, installed, say

    with installed():  # first: a signal from here on is one line and 130/143/129 (exit_signals)
        code = _main(argv, say, exit_code)
        if argv is None:  # the command line: end here, still under the rule (see exit_signals.end)
            end(code)
        return code


def _main(argv: Sequence[str] | None, say, exit_code) -> int:
    import signal

    from ..engine.api import writes
    from .interrupts import EXIT_INTERRUPTED, Interrupted

    words = normalise_argv(sys.argv[1:] if argv is None else argv)
    if argv is None and words[0] != "console":  # the command line, not the app
        from ..engine.api import probes

        probes.install_bus_error_line()
    for stream in (sys.stdout, sys.stderr):  # PYTHONIOENCODING=ascii: "→" and names print escaped, never raise
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    collecting = gc.isenabled()
    if words[0] != "console":
        gc.disable()  # a one-shot command: no full passes while the libraries import (engine/running/collector.py)
    try:
        args, unknown = build_parser().parse_known_args(
            refuse_dash_dash_values(words))
        if unknown:
            raise UsageError(f"unrecognized arguments: {' '.join(unknown)} (see omni-console {args.command} --help)")
        check_cache_dir()
        return COMMANDS[args.command](args)
    except OPERATOR_ERRORS as exc:  # bad input (a policy's too): one line, exit 2
        print(f"omni-console: error: {plain(short_words(' '.join(str(exc).split())))}", file=sys.stderr)
        return EXIT_USAGE
    except Interrupted:  # the guard printed the line when Ctrl+C came
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # Ctrl+C inside a write or a build: what it was writing is gone
        say(signal.SIGINT)
        return EXIT_INTERRUPTED
    except writes.SignalStop as stop:  # SIGTERM / SIGHUP inside a write or a build, likewise
        say(stop.signum)
        return exit_code(stop.signum)
    finally:
        if collecting:
            gc.enable()


if __name__ == "__main__":
    sys.exit(main())
