"""`run --gpus N`'s use case: one request on N ranks at once, written and reported as one.

Data-parallel: seeds `seed … seed+N−1`, one per rank, each image next to the output with its seed in the
name (`out.png` → `out-seed0.png`); CFG-parallel (two ranks): the conditional and unconditional DiT calls
at once, one image at the output. Every rank's request is checked against the model before any rank starts
(the group's handle starts them at the load). A rank that fails or dies stops the group: one line, every
rank's memory gone with its process. The outputs are written as one under the rule a single run's write
follows: a signal before they are all in place leaves none of them, one after says all are complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..engine import default_device
from ..plan_flow import plan_for
from ..ranks.rank_group import RankFailed
from ..running.collector import loaded, quiet_until_loaded
from ..running.group_write import GroupOutput, write_results
from ..running.signal_guard import SignalGuard, pause_point
from ..running.step_cache import check_cache_support
from .checks import CheckedRun, check_run
from .event_drain import EventDrain
from .rank_report import rank_outputs, ranks_report, seeded_path
from .run_once import CancelPoints, RunDone, RunFace, RunSpec
from .service import RequestService

if TYPE_CHECKING:
    from ..handle import EngineHandle
    from ..running.runner import GenerateRequest


def run_ranks(spec: RunSpec, points: CancelPoints, face: RunFace | None = None) -> RunDone:
    """Open the group's handle (discovery and the layout's checks; no rank started yet), check every rank's
    request, then load on every rank, run, write, report. Bad input raises ConfigError before any rank starts."""
    from ..api import open_engine

    face = face or RunFace()
    layout = spec.layout
    assert layout is not None and layout.distributed, "run_ranks: a rank layout of two or more GPUs"
    device = spec.device or default_device()  # the ranks' devices were counted when the layout was checked
    with quiet_until_loaded():  # the leader's collector: off until the ranks have loaded (running/collector.py)
        engine = points.run(lambda: open_engine(spec.model, device=device, layout=layout, variant=spec.variant,
                                                telemetry_hz=None))
        try:
            plan_for(engine, spec.policy, layout=layout, forecast=False)  # the policy against the model
            request = spec.request(engine)
            check_cache_support(engine.model, request.cache)  # the family's DiT takes the kind: before any rank starts

            def checked(output: Path, r: GenerateRequest) -> CheckedRun:
                return check_run(engine.model, r, output, overwrite=spec.overwrite, fps=spec.fps, names=spec.names)

            if layout.parallel == "cfg":  # one request, both ranks: the image once, at the output
                runs = [checked(spec.output, request)] * layout.gpus
            else:
                runs = [checked(seeded_path(spec.output, r.seed), r) for r in layout.rank_requests(request)]
            return _serve(engine, spec, runs, points, face)
        finally:
            engine.close()


def _serve(engine: EngineHandle, spec: RunSpec, runs: list[CheckedRun], points: CancelPoints,
           face: RunFace) -> RunDone:
    drain = EventDrain(engine.bus.subscribe(), face.event)
    drain.start()
    queue = RequestService(engine, write_in_caller=True)  # each rank's image is written below, by rank
    try:
        try:
            points.check()
            load = points.run(engine.load, spec.policy, points.cancel)
            loaded()
            outcome = points.run(queue.wait, queue.submit(runs[0]), points.cancel)
            if outcome.state == "failed":
                raise outcome.exception or RuntimeError(outcome.error)
            result = outcome.result
        except RankFailed as exc:  # the group is stopped already: every rank's memory gone with its process
            return RunDone(failure=str(exc))
        engine.close()  # the frames are in host memory: the ranks release theirs (and say so) before the writes
    finally:
        queue.close()
        drain.finish()  # every rank's events come before the failure's line, which must be the last one
    outputs = rank_outputs(runs, result, spec.fps)
    try:
        written = write_held(points, [o for o in outputs.values() if o is not None])
    except (OSError, ValueError) as exc:  # a disk that fills, frames the writers cannot take: nothing is left
        what = getattr(exc, "filename", None) or runs[0].output.path
        why = getattr(exc, "strerror", None) or " ".join(str(exc).split())[:200] or type(exc).__name__
        return RunDone(failure=f"cannot write {what}: {why}")
    layout = spec.layout
    assert layout is not None
    return RunDone(report=ranks_report(str(spec.model), engine.device.type, layout, runs, load, result,  # type: ignore[attr-defined]
                                       outputs, written))


def write_held(points: CancelPoints, outputs: list[GroupOutput]) -> list[list[Path]]:
    """Every rank's output as one (`write_results`): a signal before they are all in place leaves none of
    them, one after says all are complete."""
    if not outputs:
        return []
    with SignalGuard():  # the first signal too now removes what is being written, or waits until all is done
        points.check()
        written = write_results(outputs)
    pause_point("after-write")
    points.check()  # a signal after the write: the line says the output is complete
    return written

