"""The frames an output preview shows, read from the file the console (or `run`) wrote: an image, or for a
video (.mp4 through PyAV, animated .gif/.webp through Pillow) a strip of frames spread over it and its
middle frame. Called off the UI thread (a worker thread): decoding a video takes a while.

Only files this tool wrote are read, and only as images and video (no other decoder, nothing executed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PIL import Image

STRIP_FRAMES = 5
THUMB_SIDE = 256
"""Frames are kept at most this many pixels a side (a terminal cell shows far less)."""
VIDEO_SUFFIXES = (".mp4", ".mkv", ".mov", ".webm")


@dataclass(frozen=True)
class OutputFrames:
    """What to show: the main image (a video's middle frame), and for a video its strip (else empty)."""

    path: Path
    main: Image.Image
    strip: tuple[Image.Image, ...] = ()
    frame_count: int = 1

    @property
    def is_video(self) -> bool:
        return self.frame_count > 1


SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I")  # a depth map's grayscale (16 bits a pixel)


def _thumb(image: Image.Image) -> Image.Image:
    if image.mode in SIXTEEN_BIT_MODES:  # the high byte: PIL's own RGB conversion clips it to white
        import numpy as np

        values = np.asarray(image).astype(np.uint32)
        image = Image.fromarray((values >> 8 if values.max() > 255 else values).astype(np.uint8))
    image = image.convert("RGB")
    image.thumbnail((THUMB_SIDE, THUMB_SIDE))
    return image


def spread(count: int, picks: int = STRIP_FRAMES) -> list[int]:
    """`picks` frame indices spread evenly over `count` frames, first and last included."""
    if count <= picks:
        return list(range(count))
    return sorted({round(i * (count - 1) / (picks - 1)) for i in range(picks)})


def _from_frames(path: Path, frames: list[Image.Image]) -> OutputFrames:
    if not frames:
        raise ValueError(f"{path.name}: no frames")
    if len(frames) == 1:
        return OutputFrames(path, frames[0])
    return OutputFrames(path, frames[len(frames) // 2], tuple(frames[i] for i in spread(len(frames))), len(frames))


def _video_frames(path: Path) -> list[Image.Image]:
    import av

    with av.open(str(path)) as container:
        return [_thumb(frame.to_image()) for frame in container.decode(video=0)]


def _image_frames(path: Path) -> list[Image.Image]:
    with Image.open(path) as opened:
        count = getattr(opened, "n_frames", 1)
        frames = []
        for index in range(count):
            opened.seek(index)
            frames.append(_thumb(opened))
        return frames


MAX_OUTPUT_BYTES = 2 * 1024**3
"""A larger file is not previewed (a history thumbnail never reads gigabytes)."""


def thumbnail_path(files: list[str] | tuple[str, ...], out_dir: Path) -> Path | None:
    """The history row's first output if it is a regular file inside the console's output folder (the history
    is cache input: a path it names elsewhere is not opened), else None."""
    if not files:
        return None
    try:
        folder = Path(out_dir).resolve()
        path = Path(files[0]).resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    if not path.is_relative_to(folder) or not path.is_file() or path.stat().st_size > MAX_OUTPUT_BYTES:
        return None
    return path


def read_output(path: Path) -> OutputFrames:
    """The preview of one output file (raises OSError/ValueError when it cannot be read)."""
    path = Path(path)
    frames = _video_frames(path) if path.suffix.lower() in VIDEO_SUFFIXES else _image_frames(path)
    return _from_frames(path, frames)


def strip_and_middle(frames: OutputFrames) -> Image.Image:
    """One picture to draw: the main image, and under a video's middle frame its strip (one row)."""
    main = frames.main
    if not frames.strip:
        return main
    width = main.width
    cell = max(1, width // len(frames.strip))
    height = max(1, round(cell * main.height / main.width))
    sheet = Image.new("RGB", (width, main.height + 2 + height))
    sheet.paste(main, (0, 0))
    for index, frame in enumerate(frames.strip):
        sheet.paste(frame.resize((cell, height)), (index * cell, main.height + 2))
    return sheet
