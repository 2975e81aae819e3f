"""Several outputs written as one: a rank group's images (`run --gpus N`: one per seed) all or none.

`write_result` makes one output whole or not at all. A group's outputs written one after the other
would leave the first ranks' files and not the rest when a signal comes between them, and the line
would name half a result. Here every output is encoded into a scratch folder beside it first (a signal
or an error meanwhile leaves nothing: the folders go), then every file of every output is put in place
in one held step (`signal_guard.held`): a signal then waits until all are there, and the line says
"output complete" for all of them. A failure while putting them in place removes the files this step
created (a replaced file stays replaced, as with one output).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .atomic_write import scratch_folder
from .audio_track import AudioTrack
from .frame_manifest import record_frames
from .outputs import OutputTarget, check_free, output_files, publish_all, stage_files
from .signal_guard import SignalGuard, held, mark_complete, pause_point


@dataclass(frozen=True, slots=True)
class GroupOutput:
    """One output of a group: its frames, its checked target, its frame rate and audio (as `write_result`)."""

    frames: Sequence[Any]
    target: OutputTarget
    fps: float | None = None
    audio: AudioTrack | None = None


def write_results(outputs: Sequence[GroupOutput]) -> list[list[Path]]:
    """Write every output, all or none (module docstring); the files of each, in order."""
    plans = [output_files(o.frames, o.target, fps=o.fps, audio=o.audio) for o in outputs]
    with SignalGuard(), contextlib.ExitStack() as stack:
        staged = []
        for index, (output, files) in enumerate(zip(outputs, plans, strict=True)):
            if index:
                pause_point("between-outputs")
            output.target.path.parent.mkdir(parents=True, exist_ok=True)
            scratch = stack.enter_context(scratch_folder(output.target.path))
            staged.append(stage_files(files, scratch, output.target.overwrite))
        paths = [[path for path, _ in files] for files in plans]
        for output, names in zip(outputs, paths, strict=True):
            check_free(names, output.target.overwrite)
        with held():
            created: list[Path] = []
            try:
                for output, temps, names in zip(outputs, staged, paths, strict=True):
                    created += publish_all(temps, names, output.target.overwrite)
                    if len(names) > 1:  # a sequence: its manifest, as `write_result` records it
                        record_frames(output.target.path, names, overwrite=output.target.overwrite)
            except BaseException:
                for path in created:
                    path.unlink(missing_ok=True)
                raise
            mark_complete([path for names in paths for path in names])
    return paths
