"""`run --gpus N`'s outputs and report, built from the group's load and result: which image each rank
writes where, and one row of figures per rank. The faces print it (text or `--json`); they build none of it.

Data-parallel images go next to the output with their seed in the name (`out.png` → `out-seed0.png`),
CFG-parallel's one image to the output itself.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..running.group_write import GroupOutput

if TYPE_CHECKING:
    from ..ranks.rank_layout import RankLayout
    from ..results import GenerateResult, LoadReport
    from .checks import CheckedRun


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
    """Where a data-parallel rank's image goes: the output's name with its seed."""
    return output.with_name(f"{output.stem}-seed{seed}{output.suffix}")


def rank_outputs(runs: list[CheckedRun], result: GenerateResult, fps: float | None) -> dict[int, GroupOutput | None]:
    """What each rank with an image of its own writes (CFG: rank 0 only); None: no frames. `fps`: the
    operator's frame rate for a video (None: the pipeline's)."""
    images = (result, *result.rank_results)  # the distinct images, by rank: each seed's (dp), CFG's one
    return {rank: _rank_output(run, images[rank], fps) for rank, run in enumerate(runs) if rank < len(images)}


def _rank_output(run: CheckedRun, image: GenerateResult, fps: float | None) -> GroupOutput | None:
    frames = list(image.frames) or ([image.image] if image.image is not None else [])
    video = run.video or image.is_video
    rate = (fps if fps is not None else image.fps) if video else None
    return GroupOutput(frames, run.output, rate, image.audio) if frames else None


def ranks_report(model: str, device: str, layout: RankLayout, runs: list[CheckedRun], load: Any,
                 result: GenerateResult, outputs: dict[int, GroupOutput | None],
                 written: list[list[Path]]) -> RanksReport:
    """The report of one request on every rank: `written` holds the files of each output that was written,
    in rank order (`write_results`)."""
    files = iter(written)
    rows = [_rank_row(rank, run, load.ranks[rank], result.ranks[rank], next(files) if outputs.get(rank) else [])
            for rank, run in enumerate(runs)]
    return RanksReport(model=model, device=device, gpus=layout.gpus, allgather=layout.allgather,
                       parallel=layout.parallel, layout=layout.describe(), streamed_bytes=load.ranks[0].streamed_bytes,
                       wall_seconds=max(r.seconds for r in result.ranks), ranks=rows)


def _rank_row(rank: int, run: CheckedRun, load: LoadReport, result: GenerateResult, files: list[Path]) -> RankRun:
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
