"""Check where a result will be written before anything loads, and write it without a race.

A bad `--output` found after a long load and generation wastes the whole run, so everything that
can be known up front is checked first: the path is not a directory, its nearest existing
ancestor is a directory we can actually create files in (checked by creating and removing a
temporary file there: `os.access` answers "yes" to root on a read-only mount or directory), a
writer exists for the suffix (Pillow for images and animated GIF/WebP, PyAV for MP4), and no file
the result would be written to exists unless the operator said so. Writing goes to a temporary file in the
same directory, put in place only when complete: linked to a new name exclusively, or (with
overwrite) moved over the old one with `os.replace` (`atomic_write`), so a half-written or empty
file never stands at an output path, even after SIGTERM or SIGHUP, and a file that appears
meanwhile is never clobbered unasked.

What each suffix holds:
- `.mp4`: every frame as one video (see `video_encoders`); for video pipelines only — a still image
  as a one-frame video is refused before load, since it is almost surely the wrong model or suffix.
- `.gif`, `.webp`: every frame as one animation looping forever (one frame: a still image).
- `.wav`, `.flac`: the waveform of a pipeline that makes audio only (`audio_track`): 32-bit float samples,
  exactly the pipeline's, or 16-bit FLAC.
- any other Pillow suffix (`.png`, `.jpg`, …): one frame is that file; several frames are a numbered
  sequence beside it, `NAME-0001.png`, `NAME-0002.png`, … (zero-padded to the frame count's width,
  at least 4 digits). An existing file among any of those names is refused unless overwrite; when the
  frame count is not known up front, any existing `NAME-<digits>.png` is refused likewise. The frames
  written are recorded in a manifest beside them (`frame_manifest`); with overwrite, the frames an
  earlier run of this tool recorded there and this run did not rewrite are removed, so the folder holds
  one sequence, not a mix of two. No other file is ever deleted, and a single-file output deletes nothing.
"""

from __future__ import annotations

import functools
import io
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from ..errors import ConfigError
from .atomic_write import file_mode, publish_new, scratch_folder, write_new, write_replacing
from .audio_track import AudioTrack, encode_audio_file
from .frame_manifest import record_frames
from .signal_guard import SignalGuard, held, mark_complete, pause_point

SUGGESTED_SUFFIXES = (".png", ".jpg", ".webp", ".tiff", ".bmp")
VIDEO_SUGGESTED_SUFFIXES = (".mp4", ".webp", ".gif", ".png")
VIDEO_SUFFIXES = (".mp4",)
AUDIO_SUFFIXES = (".wav", ".flac")
AUDIO_FORMAT = "AUDIO"
ANIMATED_FORMATS = ("GIF", "WEBP")
MP4_FORMAT = "MP4"
PROBE_PREFIX = ".omni-console-probe-"
SEQUENCE_MIN_DIGITS = 4
DEFAULT_FPS = 16.0  # used when neither the caller nor the pipeline names a frame rate

Kind = Literal["still", "animation", "video", "audio"]


@dataclass(frozen=True, slots=True)
class OutputTarget:
    """A checked output path, the format its suffix selects and what kind of file that is."""

    path: Path
    image_format: str  # a Pillow format name, "MP4", or "AUDIO" (`.wav`, `.flac`)
    overwrite: bool
    kind: Kind = "still"
    expected_frames: int | None = None  # known before load (None: not known)


@functools.cache
def _writer_for(suffix: str) -> str | None:
    """Pillow's format for `suffix` if it has a save handler that writes RGB images."""
    from PIL import Image

    Image.init()
    image_format = Image.registered_extensions().get(suffix)
    if image_format is None or image_format not in Image.SAVE:
        return None
    try:  # some registered writers are stubs without a handler, or refuse RGB (XBM, MSP, Palm)
        Image.new("RGB", (2, 2)).save(io.BytesIO(), format=image_format)
    except Exception:  # noqa: BLE001 - any failure means: no usable writer
        return None
    return image_format


@functools.cache
def _animation_writer(image_format: str) -> bool:
    """True if this Pillow build writes several frames of `image_format` into one file."""
    from PIL import Image

    frames = [Image.new("RGB", (2, 2), (i, 0, 0)) for i in (0, 255)]
    try:
        frames[0].save(io.BytesIO(), format=image_format, save_all=True, append_images=frames[1:], duration=100)
    except Exception:  # noqa: BLE001
        return False
    return True


def _mp4_writer_problem() -> str | None:
    """None if MP4 files can be written here, else why not."""
    try:
        from .video_encoders import mp4_codec

        mp4_codec()
    except ImportError:
        return "writing .mp4 needs PyAV (pip install av)"
    except RuntimeError as exc:
        return str(exc)
    return None


def _nearest_existing(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _probe_writable(directory: Path) -> str | None:
    """None if a file can be created in `directory`, else the reason (the OS's words)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=directory)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(probe)
    return None


def sequence_paths(path: Path, count: int) -> list[Path]:
    """Where `count` frames of a still-image target go: the path itself for one frame, else
    NAME-0001.SUF … (digits: the count's width, at least SEQUENCE_MIN_DIGITS)."""
    if count <= 1:
        return [path]
    digits = max(SEQUENCE_MIN_DIGITS, len(str(count)))
    return [path.with_name(f"{path.stem}-{i:0{digits}d}{path.suffix}") for i in range(1, count + 1)]


def existing_sequence_files(path: Path) -> list[Path]:
    """Files already named like a numbered sequence of `path` (NAME-<digits>.SUF), sorted."""
    pattern = re.compile(re.escape(path.stem) + r"-[0-9]+" + re.escape(path.suffix))  # ASCII digits only
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return []
    return sorted(p for p in entries if pattern.fullmatch(p.name))


def _kind_of(shown: str, suffix: str, video: bool | None, audio: bool | None = None) -> tuple[str, Kind]:
    if audio:
        if suffix not in AUDIO_SUFFIXES:
            what = f"not {suffix!r}" if suffix else "no file suffix"
            raise ConfigError(f"{shown}: this model makes audio only (use {' or '.join(AUDIO_SUFFIXES)}; {what})")
        return AUDIO_FORMAT, "audio"
    if suffix in AUDIO_SUFFIXES:
        if audio is False:
            made = "videos" if video else "images"
            raise ConfigError(f"{shown}: {suffix} is for audio and this model makes {made}")
        try:
            import av  # noqa: F401
        except ImportError:
            raise ConfigError(f"{shown}: writing {suffix} needs PyAV (pip install av)") from None
        return AUDIO_FORMAT, "audio"
    if suffix in VIDEO_SUFFIXES:
        if video is False:
            raise ConfigError(f"{shown}: {suffix} is for videos and this model makes still images "
                              f"(use {', '.join(SUGGESTED_SUFFIXES)}, …)")
        if (problem := _mp4_writer_problem()) is not None:
            raise ConfigError(f"{shown}: {problem}")
        return MP4_FORMAT, "video"
    image_format = _writer_for(suffix) if suffix else None
    if image_format is None:
        if video:
            what = f"no video or image writer for {suffix!r}" if suffix else "no file suffix to choose a format"
            raise ConfigError(f"{shown}: {what} (use {', '.join(VIDEO_SUGGESTED_SUFFIXES)}, …)")
        what = f"no image writer for {suffix!r}" if suffix else "no file suffix to choose an image format"
        videos = "" if video is False else f"; a video: {', '.join(VIDEO_SUGGESTED_SUFFIXES)}"
        raise ConfigError(f"{shown}: {what} (use {', '.join(SUGGESTED_SUFFIXES)}, …{videos})")
    if image_format in ANIMATED_FORMATS and _animation_writer(image_format):
        return image_format, "animation"
    return image_format, "still"


def _check_not_replaced(shown: str, path: Path, kind: Kind, video: bool | None, frames: int | None,
                        overwrite: bool) -> None:
    """Refuse a result that would land on an existing file (any, without overwrite; a directory, always)."""
    many = kind == "still" and video is not False and (frames is None or frames > 1)
    if not many:
        if os.path.lexists(path) and not overwrite:
            raise ConfigError(f"{shown} exists; pass --overwrite to replace it")
        return
    if frames is not None:
        names = sequence_paths(path, frames)
        span = f"the {frames} frames go to {names[0].name} … {names[-1].name}"
    else:  # one frame is `path`, several are NAME-<digits>.SUF: refuse both
        names = [path, *existing_sequence_files(path)]
        span = f"a video's frames go to {sequence_paths(path, 2)[0].name}, …"
    for name in names:
        if name.is_dir():
            raise ConfigError(f"{shown}: {name} is a directory ({span})")
        if os.path.lexists(name) and not overwrite:
            where = "" if name == path else f": {name.name}"
            raise ConfigError(f"{shown}{where} exists ({span}); pass --overwrite to replace it")


def _check_place(shown: str, path: Path, video: bool | None) -> None:
    if path.is_dir():
        example = "out.mp4" if video else "out.png"
        raise ConfigError(f"{shown} is a directory (name a file, e.g. {path / example})")
    parent = path.parent
    anchor = _nearest_existing(parent)
    if not anchor.is_dir():
        raise ConfigError(f"{shown}: {anchor} is not a directory")
    reason = _probe_writable(anchor)
    if reason is not None:
        raise ConfigError(f"{shown}: cannot create files in {anchor} ({reason})")


def check_output_place(path: Path, *, flag: str = "--output") -> None:
    """The checks that need no model: not a directory, a folder we can write in, a writer for the suffix.
    (What files exist matters only once it is known whether the model makes a video: `check_output`.)"""
    shown = f"{flag} {str(path)!r}"
    _check_place(shown, path, None)
    _kind_of(shown, path.suffix.lower(), None)


def check_output(path: Path, *, overwrite: bool = False, flag: str = "--output", video: bool | None = None,
                 frames: int | None = None, audio: bool | None = None) -> OutputTarget:
    """Refuse, with one line, an output the run could not write; reads the file system only.

    `video`: whether the model makes videos (None: not known); `frames`: how many frames the result will
    have, when known before load (None: not known; an unknown video count checks every sequence name);
    `audio`: whether the model makes audio only (its result is a `.wav` or `.flac`; None: not known).
    """
    shown = f"{flag} {str(path)!r}"
    _check_place(shown, path, video)
    image_format, kind = _kind_of(shown, path.suffix.lower(), video, audio)
    _check_not_replaced(shown, path, kind, False if kind == "audio" else video, frames, overwrite)
    return OutputTarget(path, image_format, overwrite, kind, frames)


# ---------------------------------------------------------------- writing

def _write_file(path: Path, overwrite: bool, write: Callable[[BinaryIO], None]) -> None:
    """Write one file: new (exclusive), or replace only with overwrite.

    Either way the bytes go to `.NAME.XXXX.tmp` beside it first and are put in place whole
    (`atomic_write`); SIGTERM, SIGHUP or Ctrl+C meanwhile (`SignalGuard`, main thread) removes that
    temporary file and ends the command (143 / 129 / 130), so neither a partial nor an empty file is ever
    left under the name. One arriving while it is put in place waits until it is (then it is complete)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    done = functools.partial(mark_complete, [path])
    with SignalGuard():
        if overwrite and os.path.lexists(path):
            write_replacing(path, write, published=done)
            return
        try:
            write_new(path, write, published=done)
        except FileExistsError:
            if overwrite:
                write_replacing(path, write, published=done)
                return
            raise _appeared(path) from None


def _appeared(path: Path) -> ConfigError:
    return ConfigError(f"--output {str(path)!r} appeared while generating; not replaced "
                       "(pass --overwrite to replace it)")


def _saver(image: Any, image_format: str) -> Callable[[BinaryIO], None]:
    return lambda stream: image.save(stream, format=image_format)


Writer = Callable[[BinaryIO], None]


def output_files(frames: Sequence[Any], target: OutputTarget, *, fps: float | None,
                 audio: AudioTrack | None = None) -> list[tuple[Path, Writer]]:
    """The files `frames` become at a checked target, each with what writes its bytes: one video, one
    animation, one image, or a numbered sequence (`NAME-0001.png`, …)."""
    from .video_encoders import encode_animation, encode_mp4, rgb_images, still_images

    if target.kind == "audio":
        if audio is None:
            raise ValueError("no audio to write")
        suffix = target.path.suffix.lower()
        return [(target.path, lambda stream: encode_audio_file(audio, stream, suffix))]
    if not frames:
        raise ValueError("no frames to write")
    rate = DEFAULT_FPS if fps is None else fps
    if target.kind == "video":
        return [(target.path, lambda stream: encode_mp4(frames, stream, rate, audio))]
    if target.kind == "animation":
        images = rgb_images(frames)
        return [(target.path, lambda stream: encode_animation(images, stream, target.image_format, rate))]
    images = still_images(frames, target.image_format)
    paths = sequence_paths(target.path, len(images))
    return [(path, _saver(image, target.image_format)) for path, image in zip(paths, images, strict=True)]


def write_result(frames: Sequence[Any], target: OutputTarget, *, fps: float | None,
                 audio: AudioTrack | None = None) -> list[Path]:
    """Write every frame to a checked target (see the module docstring); returns the files written.

    `frames`: PIL images or HxWx3 arrays (uint8, or float in [0, 1]). `fps` None: DEFAULT_FPS. `audio`: the
    pipeline's waveform, a second stream of an MP4 (`output_notes.write_notes` says when another target drops it).
    """
    files = output_files(frames, target, fps=fps, audio=audio)
    if len(files) == 1:
        ((path, write),) = files
        _write_file(path, target.overwrite, write)
        return [path]
    return _write_sequence(files, target)


def stage_files(files: Sequence[tuple[Path, Writer]], scratch: Path, overwrite: bool) -> list[Path]:
    """Each file written whole into `scratch` under its own name, with the mode it will have in place."""
    staged = []
    for path, write in files:
        temp = scratch / path.name
        mode = file_mode(path, overwrite)
        with temp.open("xb") as stream:
            write(stream)
            os.fchmod(stream.fileno(), mode)
        staged.append(temp)
        pause_point("between-frames")
    return staged


def check_free(paths: Sequence[Path], overwrite: bool) -> None:
    """Without overwrite, none of `paths` may have appeared meanwhile (checked again as each is linked)."""
    if not overwrite and (taken := next((p for p in paths if os.path.lexists(p)), None)):
        raise _appeared(taken)


def _write_sequence(files: Sequence[tuple[Path, Writer]], target: OutputTarget) -> list[Path]:
    """Every frame into a scratch folder beside the output first, then all put in place in one held step.

    A signal (or an error) while frames are encoded leaves nothing (the scratch folder goes); one that
    comes while they are put in place waits until every frame and the manifest are there."""
    target.path.parent.mkdir(parents=True, exist_ok=True)
    paths = [path for path, _ in files]
    with SignalGuard(), scratch_folder(target.path) as scratch:
        staged = stage_files(files, scratch, target.overwrite)
        check_free(paths, target.overwrite)
        with held():
            publish_all(staged, paths, target.overwrite)
            record_frames(target.path, paths, overwrite=target.overwrite)  # and remove our own stale frames
            mark_complete(paths)
    return paths


def publish_all(staged: Sequence[Path], paths: Sequence[Path], overwrite: bool) -> list[Path]:
    """Put each staged file at its name: replacing with overwrite, else only where the name is free;
    on a failure the files this call created are removed again (replaced ones stay new). Returns the
    files it created (not those it replaced)."""
    created: list[Path] = []
    try:
        for temp, path in zip(staged, paths, strict=True):
            if overwrite and os.path.lexists(path):
                os.replace(temp, path)
                continue
            try:
                publish_new(temp, path)
            except FileExistsError:
                if not overwrite:
                    raise _appeared(path) from None
                os.replace(temp, path)
                continue
            created.append(path)
    except BaseException:
        for path in created:
            path.unlink(missing_ok=True)
        raise
    return created
