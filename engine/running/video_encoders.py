"""Encode a list of frames into one open binary stream: MP4 through PyAV, animated GIF/WebP through Pillow.

These functions only encode; `engine.running.outputs` decides which file the stream is (created exclusively,
or a temporary file moved over an old one), so every container gets the same no-clobber rules.

- MP4: H.264 (`libx264`) when the FFmpeg inside PyAV's wheel has that encoder, else MPEG-4 part 2,
  in yuv420p, every frame, at the caller's frame rate; a pipeline's audio (LTX-2) as a FLAC stream
  beside it (`audio_track`). yuv420p stores colour per 2x2 pixel block, so an
  odd width or height is padded by repeating the last column/row once (never cropped: every generated
  pixel is kept); `mp4_size` tells the caller the stored size so the report can say so.
- GIF/WebP: every frame, looping forever, each frame shown for 1/fps. Durations are whole milliseconds
  (WebP) or centiseconds (GIF), spread so the total play time stays N/fps; the encoders store a frame
  identical to the one before it once, with the two durations added (play time unchanged).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

if TYPE_CHECKING:
    from .audio_track import AudioTrack

MP4_CODECS = ("libx264", "mpeg4")  # first one the installed FFmpeg can encode
MP4_PIXEL_FORMAT = "yuv420p"
X264_CRF = "18"  # visually lossless for most content; the encoder's default (23) smears fine noise
MAX_FPS_DENOMINATOR = 1001  # NTSC-style rates (24000/1001) stay exact
GIF_TICK_MS = 10  # GIF stores frame delays in centiseconds
GIF_SLOW_BELOW_MS = 20  # players show shorter GIF delays as 100 ms
WEBP_QUALITY = 90


def rgb_array(frame: Any) -> np.ndarray:
    """A frame (PIL image, or an HxWx3 array: uint8, or float in [0, 1] as diffusers' "np" output)
    as an HxWx3 uint8 array."""
    if is_sixteen_bit(frame):  # the high byte: PIL's own conversion clips every value above 255 to white
        return np.repeat((np.asarray(frame).astype(np.uint16) >> 8).astype(np.uint8)[..., None], 3, axis=-1)
    if hasattr(frame, "convert"):
        return np.asarray(frame.convert("RGB"))
    array = np.asarray(frame)
    if array.ndim == 3 and array.shape[-1] == 4:  # RGBA: the colour without its alpha (a format without one)
        array = array[..., :3]
    if array.ndim != 3 or array.shape[-1] != 3:
        raise ValueError(f"a frame must be an RGB image (height x width x 3), got shape {array.shape}")
    if array.dtype != np.uint8:  # diffusers' numpy_to_pil rule for float frames
        array = (np.clip(array, 0.0, 1.0) * 255).round().astype(np.uint8)
    return array


ALPHA_FORMATS = ("PNG", "WEBP", "TIFF")  # still formats PIL writes with an alpha channel


def has_alpha(frame: Any) -> bool:
    """An RGBA frame: a PIL image with alpha, or an HxWx4 array (a layered pipeline's RGBA-VAE output)."""
    if hasattr(frame, "mode"):
        return frame.mode in ("RGBA", "LA", "PA") or (frame.mode == "P" and "transparency" in frame.info)
    shape = getattr(frame, "shape", None)
    return shape is not None and len(shape) == 3 and shape[-1] == 4


SIXTEEN_BIT_FORMATS = ("PNG", "TIFF")  # still formats PIL writes 16-bit grayscale ("I;16": a depth map) in


def is_sixteen_bit(frame: Any) -> bool:
    """A 16-bit grayscale PIL image (a depth map, `prediction_maps`)."""
    return getattr(frame, "mode", "").startswith("I;16")


def still_images(frames: Sequence[Any], image_format: str) -> list[Any]:
    """Frames as PIL images for a still format: RGBA where a frame has alpha and the format keeps it, 16-bit
    grayscale where the format keeps that, else RGB."""
    from PIL import Image

    stills = []
    for frame in frames:
        if is_sixteen_bit(frame) and image_format in SIXTEEN_BIT_FORMATS:
            stills.append(frame)
        elif not has_alpha(frame) or image_format not in ALPHA_FORMATS:
            stills.extend(rgb_images([frame]))
        elif hasattr(frame, "convert"):
            stills.append(frame.convert("RGBA"))
        else:
            array = np.asarray(frame)
            if array.dtype != np.uint8:  # diffusers' numpy_to_pil rule for float frames
                array = (np.clip(array, 0.0, 1.0) * 255).round().astype(np.uint8)
            stills.append(Image.fromarray(array, "RGBA"))
    return stills


def rgb_images(frames: Sequence[Any]) -> list[Any]:
    from PIL import Image

    return [frame.convert("RGB") if hasattr(frame, "convert") and not is_sixteen_bit(frame)
            else Image.fromarray(rgb_array(frame)) for frame in frames]


@functools.cache
def mp4_codec() -> str:
    """The encoder MP4 files are written with (the first of MP4_CODECS that PyAV's FFmpeg has)."""
    import av

    for name in MP4_CODECS:
        try:
            av.codec.Codec(name, "w")
        except Exception:  # noqa: BLE001 - PyAV raises different types across versions for "no such encoder"
            continue
        return name
    raise RuntimeError(f"PyAV's FFmpeg has none of the encoders {', '.join(MP4_CODECS)}")


def mp4_size(width: int, height: int) -> tuple[int, int]:
    """The stored size of a width x height video: each odd side padded by one (yuv420p needs even sides)."""
    return width + width % 2, height + height % 2


def fps_fraction(fps: float) -> Fraction:
    if not math.isfinite(fps) or fps <= 0:
        raise ValueError(f"frame rate {fps}: must be a positive finite number")
    return Fraction(fps).limit_denominator(MAX_FPS_DENOMINATOR)


def _same_size(arrays: list[np.ndarray]) -> tuple[int, int]:
    sizes = {a.shape[:2] for a in arrays}
    if len(sizes) != 1:
        raise ValueError(f"all frames of a video must have one size, got {sorted(sizes)}")
    height, width = sizes.pop()
    return width, height


def encode_mp4(frames: Sequence[Any], stream: BinaryIO, fps: float, audio: AudioTrack | None = None) -> None:
    """Write every frame as one MP4 video into a seekable binary stream, with the pipeline's `audio` as a
    second stream when it made some (`audio_track`)."""
    import av

    from .audio_track import add_audio_stream, mux_audio

    arrays = [rgb_array(f) for f in frames]
    if not arrays:
        raise ValueError("no frames to write")
    width, height = _same_size(arrays)
    stored_width, stored_height = mp4_size(width, height)
    codec = mp4_codec()
    with av.open(stream, mode="w", format="mp4") as container:
        video = container.add_stream(codec, rate=fps_fraction(fps))
        video.width, video.height, video.pix_fmt = stored_width, stored_height, MP4_PIXEL_FORMAT
        if codec == "libx264":
            video.options = {"crf": X264_CRF}
        else:  # MPEG-4 part 2 defaults to 200 kbit/s; give it about 4 bits per pixel per second
            video.bit_rate = max(400_000, stored_width * stored_height * math.ceil(fps) * 4)
        sound = add_audio_stream(container, audio) if audio is not None else None
        for array in arrays:
            if (stored_width, stored_height) != (width, height):
                array = np.pad(array, ((0, stored_height - height), (0, stored_width - width), (0, 0)), mode="edge")
            for packet in video.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(array), format="rgb24")):
                container.mux(packet)
        for packet in video.encode(None):  # flush the frames the encoder still holds (B-frames)
            container.mux(packet)
        if sound is not None:
            mux_audio(container, sound, audio)


def frame_durations_ms(count: int, fps: float, tick_ms: int = 1) -> list[int]:
    """Per-frame display times in whole ticks whose sum stays closest to count/fps seconds
    (e.g. 16 fps in GIF ticks: 60, 70, 60, 60, 70, … ms instead of 60 ms each, a 4 % drift)."""
    ticks_per_frame = 1000 / (fps * tick_ms)
    edges = [round(i * ticks_per_frame) for i in range(count + 1)]
    return [max(1, (b - a)) * tick_ms for a, b in zip(edges, edges[1:], strict=False)]


def encode_animation(frames: Sequence[Any], stream: BinaryIO, image_format: str, fps: float) -> None:
    """Write every frame as one animated GIF or WebP (loops forever) into a binary stream."""
    images = rgb_images(frames)
    if not images:
        raise ValueError("no frames to write")
    fps_fraction(fps)  # the same refusal of a bad rate as MP4
    tick = GIF_TICK_MS if image_format == "GIF" else 1
    options: dict[str, Any] = {"save_all": True, "append_images": images[1:], "loop": 0,
                               "duration": frame_durations_ms(len(images), fps, tick)}
    if image_format == "WEBP":
        options["quality"] = WEBP_QUALITY
    images[0].save(stream, format=image_format, **options)


def gif_is_slow(fps: float) -> bool:
    """True when GIF players would show this rate's frames slower than asked."""
    return min(frame_durations_ms(2, fps, GIF_TICK_MS)) < GIF_SLOW_BELOW_MS
