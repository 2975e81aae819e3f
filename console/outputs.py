"""Where the console saves generated images: a new file every time, never one that exists.

Names carry the local time and the request number, `20250301-142501-request-3.png`; a second
image in the same second with the same number (two consoles in one directory) gets `-2`, `-3`, …
Request numbers restart at 1 in every process, so a name from the number alone would replace an
earlier run's image. Each file is written whole into a temporary file in the folder first and then
hard-linked to its name, which fails if the name exists (`engine.running.atomic_write`): even two processes
racing for one name never replace each other's file (the loser takes the next suffix), and `q` or
SIGTERM while a large image is written never leaves a truncated file under a final name (the app
removes the temporary file before it exits).

A video result is saved the way `run --output NAME.mp4` writes one (`engine.running.outputs.write_result`,
every frame, the pipeline's frame rate) into a scratch folder beside, then put under the same kind
of name with `.mp4` the same way; a pipeline's audio alone (Stable Audio, ACE-Step) likewise as `.wav`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..engine.api import checks, writes

MAX_SUFFIX = 1000
"""Collisions tried within one second before giving up (a real directory never gets near)."""
VIDEO_SUFFIX = ".mp4"
AUDIO_SUFFIX = ".wav"
now = time.time
"""The clock of the names (a module attribute so tests can pin it)."""


def output_stem(request_id: int, when: float | None = None) -> str:
    """`YYYYmmdd-HHMMSS-request-N` in local time (sorts chronologically in a listing)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now() if when is None else when))
    return f"{stamp}-request-{request_id}"


def save_image(image: Any, out_dir: Path, request_id: int, when: float | None = None) -> Path:
    """Write `image` (PIL) as PNG under a new name in `out_dir`; returns the absolute path.

    Raises OSError (disk full, no permission) or FileExistsError when every suffix is taken; a
    file this call created and could not finish writing is removed again (it is ours, half-written).
    """
    def write(scratch: Path) -> Path:
        done = scratch / "image.png"
        with done.open("xb") as handle:
            image.save(handle, format="PNG")
        return done

    return _save_new(out_dir, output_stem(request_id, when), ".png", write)


def save_video(frames: Sequence[Any], out_dir: Path, request_id: int, fps: float | None,
               when: float | None = None, audio: Any = None) -> Path:
    """Write every frame (PIL images) as an .mp4 under a new name in `out_dir`, with the pipeline's `audio`
    (an `AudioTrack`) when it made some; returns the absolute path.

    Same guarantees as `save_image`: no existing file is opened or replaced, and on failure only
    this call's own claim and scratch files are removed.
    """
    def write(scratch: Path) -> Path:
        target = checks.check_output(scratch / f"video{VIDEO_SUFFIX}", video=True)
        return writes.write_result(list(frames), target, fps=fps, audio=audio)[0]

    return _save_new(out_dir, output_stem(request_id, when), VIDEO_SUFFIX, write)


def save_audio(audio: Any, out_dir: Path, request_id: int, when: float | None = None) -> Path:
    """Write an audio-only result's waveform (an `AudioTrack`) as a .wav of its exact samples, under a new name
    in `out_dir`, with `save_image`'s guarantees."""
    def write(scratch: Path) -> Path:
        target = checks.check_output(scratch / f"audio{AUDIO_SUFFIX}", audio=True)
        return writes.write_result([], target, fps=None, audio=audio)[0]

    return _save_new(out_dir, output_stem(request_id, when), AUDIO_SUFFIX, write)


def save_result(result: Any, out_dir: Path, request_id: int, when: float | None = None) -> Path:
    """A request's output: a video result as .mp4 (fps from the result), an image as .png, audio alone as .wav."""
    frames = getattr(result, "frames", None)
    if not frames and getattr(result, "audio", None) is not None:
        return save_audio(result.audio, out_dir, request_id, when)
    if getattr(result, "is_video", False) and frames:
        return save_video(frames, out_dir, request_id, getattr(result, "fps", None), when,
                          getattr(result, "audio", None))
    return save_image(result.image, out_dir, request_id, when)


def save_trace(trace: dict[str, Any], out_dir: Path, request_id: int, when: float | None = None) -> Path:
    """Write a request's trace (`RequestRecord.trace`) as `...-request-N-trace.json`, a new name like an image's."""
    def write(scratch: Path) -> Path:
        done = scratch / "trace.json"
        writes.write_trace(done, trace)
        return done

    return _save_new(out_dir, f"{output_stem(request_id, when)}-trace", ".json", write)


def _save_new(out_dir: Path, stem: str, extension: str, write: Callable[[Path], Path]) -> Path:
    """Write once into a scratch folder beside the names (`write` returns the finished file), then give
    it `stem{extension}` (or `stem-2{extension}`, …), the first name that does not exist."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with writes.scratch_folder(out_dir / stem) as scratch:
        done = write(scratch)
        for suffix in range(1, MAX_SUFFIX + 1):
            path = out_dir / (f"{stem}{extension}" if suffix == 1 else f"{stem}-{suffix}{extension}")
            try:
                writes.publish_new(done, path)
            except FileExistsError:
                continue
            return path.resolve()
    raise FileExistsError(f"no free name for {stem}{extension} in {out_dir} after {MAX_SUFFIX} tries")
