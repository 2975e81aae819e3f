"""`omni-console run --gpus N`: one request on N ranks at once, then one report.

Data-parallel (`--parallel dp`): seeds `seed … seed+N−1`, one per rank. CFG-parallel (`--parallel
cfg`, two ranks): the request's conditional and unconditional DiT calls run at once on the two ranks
(`engine.cfg_parallel`), one image.

The same order as a single-GPU run: every flag and the request are checked against the model before
any rank starts; then the rank group (`engine.rank_group`) loads on every rank and runs. Data-parallel
images are written next to `--output` with their seed in the name (`out.png` → `out-seed0.png`,
`out-seed1.png`), CFG's one image at `--output`, never over a file unless `--overwrite`. A rank that
fails or dies stops the group: one line, exit 1, every rank's memory gone with its process.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..engine.api import (
    RankFailed,
    RankGroup,
    RankLayout,
    check_experts,
    default_device,
    open_engine,
    plain,
    plan_for,
    write_result,
)
from ..engine.errors import ConfigError
from ..engine.events import Event
from ..offload.units import format_bytes, format_seconds
from .args import resolve_model_path
from .event_text import progress_line
from .interrupts import InterruptGuard
from .request_defaults import default_request
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


def run_ranks(args: argparse.Namespace, guard: InterruptGuard, layout: RankLayout, flags: Any) -> int:
    """`flags`: the checked `RunFlags` of `console.headless` (policy, device, options)."""
    device = flags.device or default_device()  # the ranks' devices were counted by layout_from_args
    if flags.budget is not None:
        raise ConfigError("--vram-budget with --gpus: plan one rank's budget with `plan --gpus`, then pass its policy")
    model_path = resolve_model_path(args.model)
    probe = open_engine(model_path, device="cpu", variant=args.variant)  # discovery only: nothing loads here
    plan_for(probe, flags.policy, layout=layout, forecast=False)  # the policy, then the layout, checked
    check_experts(layout, probe.model)
    request = default_request(probe, prompt=args.prompt, steps=args.steps, height=args.height, width=args.width,
                              seed=args.seed, guidance=args.guidance, frames=args.frames,
                              negative_prompt=args.negative_prompt, max_sequence_length=args.max_sequence_length,
                              image=args.image, params=flags.options.params)
    if layout.parallel == "cfg":  # one request, both ranks: the image once, at --output
        runs = [checked_request(probe.model, request, flags.options, args.output, overwrite=args.overwrite)] * 2
    else:
        runs = [checked_request(probe.model, r, flags.options, seeded_path(args.output, r.seed),
                                overwrite=args.overwrite)
                for r in (replace(request, seed=request.seed + k) for k in range(layout.gpus))]
    err = Console(stderr=True)

    def show(rank: int, event: Event) -> None:
        line = progress_line(event)  # stderr, with --json too
        if line is None:
            return
        with guard.output_lock:  # the interrupt line, once printed, stays the last
            if not guard.interrupted:
                err.print(f"[rank {rank}] {line[0]}", style=line[1], markup=False, highlight=False, soft_wrap=True)

    guard.check()
    group = guard.run(lambda: RankGroup(model_path, layout, device.type, variant=args.variant, on_event=show))
    try:
        loads = guard.run(group.load, flags.policy)
        results = guard.run(group.generate, [r.request for r in runs])
    except RankFailed as exc:
        err.print(f"omni-console: {plain(exc)}", markup=False, highlight=False, soft_wrap=True)
        return EXIT_FAILED
    finally:
        group.close()
    wall = max(r.seconds for r in results)
    rows = []
    for rank, (run, load, result) in enumerate(zip(runs, loads, results, strict=True)):
        frames = list(result.frames) or ([result.image] if result.image is not None else [])
        video = run.video or result.is_video
        fps = (flags.options.fps if flags.options.fps is not None else result.fps) if video else None
        writes = frames and (layout.parallel == "dp" or rank == 0)  # CFG: both ranks hold the same image
        files = write_result(frames, run.output, fps=fps) if writes else []
        steps = result.steps
        rows.append(RankRun(rank=rank, seed=run.request.seed, load_seconds=load.seconds,
                            load_phases=dict(load.phases), load_components=dict(load.components),
                            load_milestones=dict(load.milestones), dit_read_seconds=load.dit_read_seconds,
                            pinned_bytes=load.pinned_bytes,
                            block_host_bytes=load.block_host_bytes, request_seconds=result.seconds,
                            step_s_median=statistics.median(s.wall_s for s in steps) if steps else None,
                            stall_s_total=sum(s.stall_s for s in steps),
                            h2d_bytes_total=sum(s.h2d_bytes for s in steps),
                            files=[str(f) for f in files]))
    report = RanksReport(model=str(model_path), device=device.type, gpus=layout.gpus, allgather=layout.allgather,
                         parallel=layout.parallel, layout=layout.describe(), streamed_bytes=loads[0].streamed_bytes,
                         wall_seconds=wall, ranks=rows)
    if args.json:
        print(json.dumps(report.model_dump(), indent=2))
    else:
        _print(report, Console())
    return 0


def _print(r: RanksReport, console: Console) -> None:
    table = Table(title=Text(plain(f"run — {r.model} on {r.gpus} ranks ({r.device})")), caption=Text(plain(r.layout)))
    for column in ("rank", "seed", "load", "block host", "pinned", "request", "step (median)", "stall", "H2D"):
        table.add_column(column, justify="right")
    for k in r.ranks:
        table.add_row(str(k.rank), str(k.seed), format_seconds(k.load_seconds), format_bytes(k.block_host_bytes),
                      format_bytes(k.pinned_bytes), format_seconds(k.request_seconds),
                      format_seconds(k.step_s_median) if k.step_s_median is not None else "—",
                      format_seconds(k.stall_s_total), format_bytes(k.h2d_bytes_total))
    console.print(table)
    console.print(f"{r.gpus} requests in {format_seconds(r.wall_seconds)} (streamed blocks: "
                  f"{format_bytes(r.streamed_bytes)} per rank per forward)", markup=False, highlight=False)
    for k in r.ranks:
        console.print(plain(f"wrote {', '.join(k.files) or 'nothing'}"), markup=False, highlight=False, soft_wrap=True)
