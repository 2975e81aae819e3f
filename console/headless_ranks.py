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
import statistics
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..engine.api import EngineHandle, RankLayout, plain, planner, probes, service, writes
from ..engine.errors import ConfigError
from ..offload.units import format_bytes, format_seconds
from .args import resolve_model_path
from .interrupts import InterruptGuard
from .request_defaults import default_request
from .run_progress import RunProgress, rank_line
from .run_request import checked_request

EXIT_FAILED = 1


class RankRun(BaseModel):
    rank: int
    seed: int
    load_seconds: float
    load_phases: dict[str, float]
    load_components: dict[str, float]  # seconds building each component on this rank
    load_milestones: dict[str, float]  # seconds from this rank's load start: classes_imported, dits_built, ...
    dit_read_seconds: float  # this rank's parallel reads straight into place
    pinned_bytes: int
    block_host_bytes: int
    request_seconds: float
    step_s_median: float | None
    stall_s_total: float
    h2d_bytes_total: int
    files: list[str]
    host_peak_bytes: int | None = None  # this rank process's peak RSS (VmHWM); None: not measured


class RanksReport(BaseModel):
    """`run --gpus N --json`."""

    model: str
    device: str
    gpus: int
    allgather: bool
    parallel: str
    layout: str
    streamed_bytes: int
    wall_seconds: float
    ranks: list[RankRun]


def seeded_path(output: Path, seed: int) -> Path:
    return output.with_name(f"{output.stem}-seed{seed}{output.suffix}")


RAM_WITH_RANKS = ("--ram-budget with --gpus: the ranks share the host's memory, which the host plan does not split "
                  "yet; leave it out")


def run_ranks(args: argparse.Namespace, guard: InterruptGuard, layout: RankLayout, flags: Any) -> int:
    """`flags`: the checked `RunFlags` of `console.headless` (policy, device, options)."""
    device = flags.device or probes.default_device()  # the ranks' devices were counted by layout_from_args
    if flags.budget is not None:
        raise ConfigError("--vram-budget with --gpus: plan one rank's budget with `plan --gpus`, then pass its policy")
    if flags.ram_budget is not None:
        raise ConfigError(RAM_WITH_RANKS)
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
        if layout.parallel == "cfg":  # one request, both ranks: the image once, at --output
            runs = [checked_request(engine.model, request, flags.options, args.output,
                                    overwrite=args.overwrite)] * layout.gpus
        else:
            runs = [checked_request(engine.model, r, flags.options, seeded_path(args.output, r.seed),
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
    loads, results = load.ranks, result.ranks
    images = (result, *result.rank_results)  # the distinct images, by rank: each seed's (dp), CFG's one
    outputs = {rank: _rank_output(run, images[rank], flags) for rank, run in enumerate(runs) if rank < len(images)}
    try:
        written = _write_held(guard, [o for o in outputs.values() if o is not None])
    except (OSError, ValueError) as exc:  # a disk that fills, frames the writers cannot take: nothing is left
        what = getattr(exc, "filename", None) or runs[0].output.path
        why = getattr(exc, "strerror", None) or " ".join(str(exc).split())[:200] or type(exc).__name__
        err.print(f"omni-console: {plain(f'cannot write {what}: {why}')}", markup=False, highlight=False,
                  soft_wrap=True)
        return EXIT_FAILED
    files = iter(written)
    rows = [_rank_row(rank, run, loads[rank], results[rank], next(files) if outputs.get(rank) else [])
            for rank, run in enumerate(runs)]
    report = RanksReport(model=model, device=engine.device.type, gpus=layout.gpus, allgather=layout.allgather,
                         parallel=layout.parallel, layout=layout.describe(), streamed_bytes=loads[0].streamed_bytes,
                         wall_seconds=max(r.seconds for r in results), ranks=rows)
    if args.json:
        print(json.dumps(report.model_dump(), indent=2))
    else:
        _print(report, Console())
    return 0


def _rank_output(run: service.CheckedRun, image: service.GenerateResult, flags: Any) -> writes.GroupOutput | None:
    """What a rank with an image of its own writes (CFG: rank 0 only); None: no frames."""
    frames = list(image.frames) or ([image.image] if image.image is not None else [])
    video = run.video or image.is_video
    fps = (flags.options.fps if flags.options.fps is not None else image.fps) if video else None
    return writes.GroupOutput(frames, run.output, fps, image.audio) if frames else None


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


def _rank_row(rank: int, run: service.CheckedRun, load: service.LoadReport, result: service.GenerateResult,
              files: list[Path]) -> RankRun:
    """One rank's figures, with the files its own image was written to (CFG: rank 0 only)."""
    steps = result.steps
    return RankRun(rank=rank, seed=run.request.seed, load_seconds=load.seconds, load_phases=dict(load.phases),
                   load_components=dict(load.components), load_milestones=dict(load.milestones),
                   dit_read_seconds=load.dit_read_seconds, pinned_bytes=load.pinned_bytes,
                   block_host_bytes=load.block_host_bytes, request_seconds=result.seconds,
                   step_s_median=statistics.median(s.wall_s for s in steps) if steps else None,
                   stall_s_total=sum(s.stall_s for s in steps), h2d_bytes_total=sum(s.h2d_bytes for s in steps),
                   files=[str(f) for f in files],
                   host_peak_bytes=getattr(result.check, "measured_host_peak", None))


def _print(r: RanksReport, console: Console) -> None:
    table = Table(title=Text(plain(f"run — {r.model} on {r.gpus} ranks ({r.device})")), caption=Text(plain(r.layout)))
    for column in ("rank", "seed", "load", "block host", "pinned", "peak RSS", "request", "step (median)", "stall",
                   "H2D"):
        table.add_column(column, justify="right")
    for k in r.ranks:
        table.add_row(str(k.rank), str(k.seed), format_seconds(k.load_seconds), format_bytes(k.block_host_bytes),
                      format_bytes(k.pinned_bytes), format_bytes(k.host_peak_bytes), format_seconds(k.request_seconds),
                      format_seconds(k.step_s_median) if k.step_s_median is not None else "—",
                      format_seconds(k.stall_s_total), format_bytes(k.h2d_bytes_total))
    console.print(table)
    console.print(f"{r.gpus} requests in {format_seconds(r.wall_seconds)} (streamed blocks: "
                  f"{format_bytes(r.streamed_bytes)} per rank per forward)", markup=False, highlight=False)
    for k in r.ranks:
        console.print(plain(f"wrote {', '.join(k.files) or 'nothing'}"), markup=False, highlight=False, soft_wrap=True)
