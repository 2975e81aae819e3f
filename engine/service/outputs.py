"""A finished request's frames written where its checked output says: atomically, as `run` always has.

`write_outputs` is the one way a result reaches disk, for `run` (on its main thread, so a signal during the
write unwinds it: `SignalGuard`) and for the service's queue (on the engine's worker).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..running.output_notes import write_notes
from ..running.outputs import DEFAULT_FPS, write_result
from ..running.pipeline_output import frame_size
from ..running.signal_guard import SignalGuard
from .checks import CheckedRun
from .run_report import rendered_size_notes


@dataclass(frozen=True, slots=True)
class Written:
    """What a request's write put on disk, and at which frame rate (videos only)."""

    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    frames: int = 0
    video: bool = False
    fps: float | None = None  # as the report shows it: DEFAULT_FPS when neither the flag nor the pipeline says
    fps_source: str | None = None  # "--fps", "pipeline" or "default" (videos), else None


def frames_of(result: Any) -> list[Any]:
    """The result's frames: its video's, else its one image (empty: nothing to write)."""
    return list(result.frames) or ([result.image] if result.image is not None else [])


def frame_rate(flag: float | None, pipeline: float | None) -> tuple[float | None, str]:
    """(rate to write at, where it came from); None: neither says, the writers' DEFAULT_FPS applies."""
    if flag is not None:
        return flag, "--fps"
    if pipeline is not None:
        return pipeline, "pipeline"
    return None, "default"


def write_outputs(result: Any, run: CheckedRun, fps: float | None = None,
                  before: Callable[[], None] | None = None) -> Written:
    """Write `result`'s frames to `run.output` (`fps`: the operator's rate, else the pipeline's).
    `before`: called inside the signal guard, just before the first byte (`run`: a Ctrl+C already pressed
    ends it there). OSError: the disk refused; ValueError: frames the writers cannot take."""
    frames = frames_of(result)
    video = run.video or result.is_video
    rate, source = frame_rate(fps, result.fps) if video else (None, None)
    files: list[Path] = []
    notes: list[str] = []
    if frames or (run.output.kind == "audio" and result.audio is not None):
        with SignalGuard():  # on the main thread a signal removes what is being written, or waits until it is complete
            if before is not None:
                before()
            notes = write_notes(frames, run.output, fps=rate, audio=result.audio)
            if frames:
                notes += rendered_size_notes(run.request.width, run.request.height, frame_size(frames[0]))
            files = write_result(frames, run.output, fps=rate, audio=result.audio)
    return Written(files, notes, len(frames), video, DEFAULT_FPS if video and rate is None else rate, source)
