"""Read a pipeline's result by its declared output class, and refuse an output that is not a picture.

diffusers pipelines name their output field differently: `images` (most), `image` (Kandinsky 5 T2I),
`frames` (video), `videos`, `audios`. Reading only `images`/`frames` made Kandinsky 5 exit 0 without a
file. The field is taken from the `*PipelineOutput` dataclass the pipeline's `__call__` returns
(its return annotation); one that returns audio alone (Stable Audio, ACE-Step) is written as a `.wav` or
`.flac` (`audio_only`, engine/running/audio_track.py), a depth or normals map as diffusers exports it
(`prediction_maps`); a pipeline that returns none of these (Stable Cascade's prior: image embeddings) is refused
before load, naming what it returns.

After the call, a result with no frame, or one that decoded to all NaN or all black (a non-finite
value somewhere in the run), is an `OutputError`: one line, exit 1, no file.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any

import numpy as np

from ..errors import ConfigError, OutputError
from .prediction_maps import PREDICTION_FIELD, map_kind

IMAGE_FIELDS = ("images", "image")
VIDEO_FIELDS = ("frames", "videos", "video")
AUDIO_FIELDS = ("audios", "audio")
WRITABLE_FIELDS = (*VIDEO_FIELDS, *IMAGE_FIELDS)  # pictures; audio alone goes to a .wav or .flac (`audio_only`)


def _output_classes(annotation: Any) -> list[type]:
    if isinstance(annotation, type):
        return [annotation] if dataclasses.is_dataclass(annotation) else []
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [c for arm in typing.get_args(annotation) for c in _output_classes(arm)]
    return []


def declared_fields(pipeline_type: type) -> list[str] | None:
    """The field names of the output dataclass(es) `__call__` declares it returns (None: not declared)."""
    try:
        annotation = inspect.signature(pipeline_type.__call__, eval_str=True).return_annotation
    except Exception:  # an annotation that does not evaluate: cannot tell
        return None
    classes = _output_classes(annotation)
    if not classes:
        return None
    return [f.name for cls in classes for f in dataclasses.fields(cls)]


def audio_only(pipeline_type: type) -> bool:
    """Whether the pipeline declares an output of audio and no picture (Stable Audio, ACE-Step, AudioLDM 2)."""
    fields = declared_fields(pipeline_type) or []
    return any(name in AUDIO_FIELDS for name in fields) and not any(name in WRITABLE_FIELDS for name in fields)


def check_output_kind(pipeline_type: type) -> None:
    """Refuse, before load, a pipeline whose declared output holds no image, video, audio or map to write."""
    fields = declared_fields(pipeline_type)
    if fields is None or any(name in WRITABLE_FIELDS for name in fields) or audio_only(pipeline_type):
        return
    if PREDICTION_FIELD in fields and map_kind(pipeline_type.__name__) is not None:
        return  # a depth or normals map, written as diffusers exports it (`prediction_maps`)
    audio = [name for name in fields if name in AUDIO_FIELDS]
    what = "audio only" if audio else ", ".join(fields) or "nothing"
    raise ConfigError(f"{pipeline_type.__name__} returns {what} ({_class_names(pipeline_type)}), not an image or "
                      "a video: nothing here could be written; not supported")


def _class_names(pipeline_type: type) -> str:
    annotation = inspect.signature(pipeline_type.__call__, eval_str=True).return_annotation
    return " or ".join(c.__name__ for c in _output_classes(annotation))


def _field(output: Any, names: tuple[str, ...]) -> Any:
    return next((value for name in names if (value := getattr(output, name, None)) is not None), None)


def _is_one_frame(value: Any) -> bool:
    """A single frame (a PIL image, or an HWC/CHW array), not a batch item's list of frames."""
    from PIL import Image

    return isinstance(value, Image.Image) or getattr(value, "ndim", None) == 3


def first_item_frames(output: Any) -> tuple[list[Any], bool]:
    """(frames of the first batch item, is_video): a video field is [batch][frame] (SANA-WM's is one video's
    [frame], unbatched), an image field [batch], or [batch][layer] for a pipeline that splits an image into
    layers (Qwen-Image-Layered): each layer a still of its own."""
    frames = _field(output, VIDEO_FIELDS)
    if frames is not None:
        if not len(frames):
            return [], True
        return (list(frames) if _is_one_frame(frames[0]) else list(frames[0])), True
    images = _field(output, IMAGE_FIELDS)
    if images is None and isinstance(output, tuple | list) and output:
        images = output[0]
    if images is None or not len(images):
        return [], False
    first = images[0]
    return ([first] if _is_one_frame(first) or not _is_layers(first) else list(first)), False


def _is_layers(value: Any) -> bool:
    """One batch item's list of still layers: a list of images, or an NHWC array of them."""
    return isinstance(value, list | tuple) and len(value) > 0 or getattr(value, "ndim", None) == 4


def frame_size(frame: Any) -> list[int] | None:
    """[width, height] of one frame (a PIL image, or an HWC array for output_type="np")."""
    size = getattr(frame, "size", None)
    if isinstance(size, tuple) and len(size) == 2:
        return [int(size[0]), int(size[1])]
    shape = getattr(frame, "shape", None)
    return [int(shape[1]), int(shape[0])] if shape is not None and len(shape) >= 2 else None


def check_frames(frames: list[Any], pipeline: str) -> None:
    """Refuse a result with nothing in it, or one decoded to all NaN or all black (exit 1, no file)."""
    if not frames:
        raise OutputError(f"{pipeline} returned no image or video frame: nothing to write")
    pixels = [np.asarray(frame, dtype=np.float32) for frame in frames]
    if all(np.isnan(p).all() for p in pixels):
        raise OutputError(f"{pipeline} decoded to NaN only (a non-finite value in the run): no file written")
    if all(not np.nan_to_num(p).any() for p in pixels):
        raise OutputError(f"{pipeline} decoded to an all-black output (NaN or zero everywhere): no file written")
