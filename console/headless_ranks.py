"""`omni-console run --gpus N`: one request on N ranks at once, then one report.

Data-parallel (`--parallel dp`): seeds `seed … seed+N−1`, one per rank. CFG-parallel (`--parallel
cfg`, two ranks): the request's conditional and unconditional DiT calls run at once on the two ranks
(`engine.ranks.cfg_parallel`), one image.

The same order as a single-GPU run: every flag and the request are checked against the model before
any rank starts; then the console's own handle for a rank group (`open_engine(…, layout=…)`, a
`GroupEngine`) loads on every rank and runs, and its per-rank reports become the rows. Data-parallel
images are written next to `--output` with their seed in the name (`out.png` → `out-seed0.png`,
`out-seed1.png`), CFG's one image at `--output`, never over a file unless `--overwrite`. A rank that
fails or dies stops the group: one line, exit 1, every rank's memory gone with its process.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from ..engine.api import EngineHandle, RankLayout, checks, plain, planner, probes, service, writes
from ..engine.errors import ConfigError
from .args import resolve_model_path
from .interrupts import InterruptGuard
from .rank_text import print_ranks_report
from .request_defaults import default_request
from .run_progress import RunProgress, rank_line
from .run_request import checked_request

EXIT_FAILED = 1


RAM_WITH_RANKS = ("--ram-budget with --gpus: the ranks share the host's memory, which the host plan does not split "
                  "yet; leave it out")


def run_ranks(args: argparse.Namespace, guard: InterruptGuard, layout: RankLayout, flags: Any) -> int:
    """`flags`: the checked `RunFlags` of `console.headless` (policy, device, options)."""
    device = flags.device or probes.default_device()  # the ranks' devices were counted by layout_from_args
    if flags.budget is not None:
        raise ConfigError("--vram-budget with --gpus: plan one rank's budget with `plan --gpus`, then pass its policy")
    if flags.ram_budget is not None:
        raise ConfigError(RAM_WITH_RANKS)
    checks.check_cache_ranks(layout, flags.options.cache)  # only where each rank's cache decides as one GPU's would
    model_path = resolve_model_path(args.model)
    guard.check()
    # the console's handle: discovery and the layout's checks here, no rank started yet (they start at the load)
    engine = guard.run(lambda: service.open_engine(model_path, device=device, layout=layout, variant=args.variant,
                                           telemetry_hz=None))
    try:
        planner.plan_for(engine, flags.policy, layout=layout, forecast=False)  # the policy against the model
        request = default_request(engine, prompt=args.prompt, steps=args.steps, height=args.height,
                                  width=args.width, seed=args.seed, guidance=args.guidance, frames=args.frames,
                                  negative_prompt=args.negative_prompt, max_sequence_length=args.max_sequence_length,
                                  image=args.image, params=flags.options.params)
        if flags.options.cache is not None:  # the family's DiT takes the kind: before any rank starts
            request = replace(request, cache=flags.options.cache)
            checks.check_cache_support(engine.model, request.cache)
        if layout.parallel == "cfg":  # one request, both ranks: the image once, at --output
            runs = [checked_request(engine.model, request, flags.options, args.output,
                                    overwrite=args.overwrite)] * layout.gpus
        else:
            runs = [checked_request(engine.model, r, flags.options, service.seeded_path(args.output, r.seed),
                                    overwrite=args.overwrite)
                    for r in layout.rank_requests(request)]
        return _load_generate_report(args, guard, layout, flags, engine, runs, str(model_path))
    finally:
        engine.close()


def _load_generate_report(args: argparse.Namespace, guard: InterruptGuard, layout: RankLayout, flags: Any,
                          engine: EngineHandle, runs: list[service.CheckedRun], model: str) -> int:
    """Load on every rank, run the request (each rank its own, `RankLayout.rank_requests`), write, report."""
    err = Console(stderr=True)
    progress = RunProgress(engine.bus.subscribe(), err, muted=lambda: guard.interrupted, lock=guard.output_lock,
                           line_for=rank_line)
    progress.start()
    failure = None
    queue = service.RequestService(engine, write_in_caller=True)  # each rank's image is written below, by rank
    try:
        try:
            guard.check()
            load = guard.run(engine.load, flags.policy, guard.cancel)
            outcome = guard.run(queue.wait, queue.submit(runs[0]), guard.cancel)
            if outcome.state == "failed":
                raise outcome.exception or RuntimeError(outcome.error)
            result = outcome.result
        except service.RankFailed as exc:  # the group is stopped already: every rank's memory gone with its process
            failure = plain(exc)
        else:
            engine.close()  # the frames are in host memory: the ranks release theirs (and say so) before the writes
    finally:
        queue.close()
        progress.finish()  # every rank's lines come before the failure's, which must be the last one
    if failure is not None:
        err.print(f"omni-console: {failure}", markup=False, highlight=False, soft_wrap=True)
        return EXIT_FAILED
    outputs = service.rank_outputs(runs, result, flags.options.fps)
    try:
        written = _write_held(guard, [o for o in outputs.values() if o is not None])
    except (OSError, ValueError) as exc:  # a disk that fills, frames the writers cannot take: nothing is left
        what = getattr(exc, "filename", None) or runs[0].output.path
        why = getattr(exc, "strerror", None) or " ".join(str(exc).split())[:200] or type(exc).__name__
        err.print(f"omni-console: {plain(f'cannot write {what}: {why}')}", markup=False, highlight=False,
                  soft_wrap=True)
        return EXIT_FAILED
    report = service.ranks_report(model, engine.device.type, layout, runs, load, result, outputs, written)
    if args.json:
        print(json.dumps(report.model_dump(), indent=2))
    else:
        print_ranks_report(report, Console())
    return 0


def _write_held(guard: InterruptGuard, outputs: list[writes.GroupOutput]) -> list[list[Path]]:
    """Every rank's output as one (`write_results`), under the rule a single run's write follows: a signal
    before they are all in place leaves none of them, one after says all are complete (exit 130/143/129)."""
    if not outputs:
        return []
    with writes.SignalGuard():  # Ctrl+C too now removes what is being written, or waits until all is complete
        guard.check()
        written = writes.write_results(outputs)
    writes.pause_point("after-write")
    guard.check()  # Ctrl+C after the write: the line said the output is complete; the exit says 130
    return written
