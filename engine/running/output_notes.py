"""What the operator should know about how a result is stored, one line each: a frame rate guessed, a size
padded for H.264, GIF delays players slow down, an alpha channel the format drops, which map
each numbered file holds, audio a target leaves out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .audio_track import audio_file_note, audio_note
from .outputs import DEFAULT_FPS, OutputTarget, sequence_paths
from .prediction_maps import MAP_NAME

if TYPE_CHECKING:
    from .audio_track import AudioTrack


def write_notes(frames: Sequence[Any], target: OutputTarget, *, fps: float | None,
                audio: AudioTrack | None = None) -> list[str]:
    """What the operator should know about how `write_result` stores these frames (one line each)."""
    from .video_encoders import (
        ALPHA_FORMATS,
        SIXTEEN_BIT_FORMATS,
        gif_is_slow,
        has_alpha,
        is_sixteen_bit,
        mp4_size,
        rgb_array,
    )

    if target.kind == "audio":
        return [audio_file_note(target.path.name, audio, target.path.suffix.lower())] if audio is not None else []
    if not frames:
        return []
    notes = []
    rate = DEFAULT_FPS if fps is None else fps
    if fps is None and (target.kind == "video" or (target.kind == "animation" and len(frames) > 1)):
        notes.append(f"no frame rate given or known for this model: {rate:g} fps (set --fps)")
    if target.kind == "video":
        height, width = rgb_array(frames[0]).shape[:2]
        stored = mp4_size(width, height)
        if stored != (width, height):
            notes.append(f"{target.path.name}: {width}x{height} padded to {stored[0]}x{stored[1]} "
                         "(repeating the last column/row; H.264 in yuv420p needs even sizes)")
    if target.kind == "animation" and target.image_format == "GIF" and len(frames) > 1 and gif_is_slow(rate):
        notes.append(f"{target.path.name}: at {rate:g} fps GIF frames last under 20 ms, which most players "
                     "show slower (use .mp4 or .webp)")
    if any(has_alpha(frame) for frame in frames) and (target.kind != "still" or target.image_format not in
                                                       ALPHA_FORMATS):
        notes.append(f"{target.path.name}: the output has an alpha channel, which this format does not keep "
                     "(use .png, .webp or .tiff)")
    if any(is_sixteen_bit(frame) for frame in frames) and (target.kind != "still" or target.image_format not in
                                                             SIXTEEN_BIT_FORMATS):
        notes.append(f"{target.path.name}: the output is 16-bit (a depth map), stored here in 8 bits "
                     "(use .png or .tiff for all 16)")
    names = [getattr(frame, "info", {}).get(MAP_NAME) for frame in frames]
    if len(frames) > 1 and all(names) and target.kind == "still":
        files = ", ".join(f"{path.name} {name}" for path, name in
                          zip(sequence_paths(target.path, len(frames)), names, strict=True))
        notes.append(f"maps: {files}")
    if audio is not None:
        notes.append(audio_note(target.path.name, audio, kept=target.kind == "video"))
    return notes
