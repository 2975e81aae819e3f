"""A request and its output checked against the model before any work: sizes, the pipeline's call
signature, whether it makes videos, and every file the output would write.

Messages name the operator's words for each field (`Names`): the CLI's flags by default, so `run`, `plan`
and the queue say the same line for the same mistake.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..loading.loader import pipeline_class, pipeline_init_values
from ..model_dir.discovery import ModelInfo
from ..running.call_options import call_signature, check_call, option_parameter
from ..running.outputs import OutputTarget, check_output
from ..running.pipeline_output import audio_only
from ..running.request_checks import check_request
from ..running.request_limits import check_limits
from ..running.runner import GenerateRequest

Names = Mapping[str, str]

REQUEST_NAMES: Names = {"steps": "--steps", "height": "--height", "width": "--width", "seed": "--seed",
                        "guidance": "--guidance"}
CALL_NAMES: Names = {**REQUEST_NAMES, "frames": "--frames", "negative_prompt": "--negative-prompt",
                     "max_sequence_length": "--max-sequence-length", "image": "--image", "param": "--param"}


@dataclass(frozen=True, slots=True)
class CheckedRun:
    """A request this pipeline can run and the output target its result will be written to."""

    request: GenerateRequest
    output: OutputTarget
    video: bool
    fps: float | None = None  # the operator's frame rate (videos); None: the pipeline's, else the default


def frames_parameter(model: ModelInfo) -> str | None:
    """The pipeline's frame-count parameter (`num_frames`, …); None for a still-image pipeline."""
    return option_parameter(call_signature(model.pipeline_class), "frames")


def makes_video(model: ModelInfo) -> bool:
    return frames_parameter(model) is not None


def expected_frames(model: ModelInfo, request: GenerateRequest) -> int | None:
    """How many frames the result will have, known before load: the request's, else the pipeline's own
    default (None: the pipeline computes it at call time)."""
    key = frames_parameter(model)
    if key is None:
        return 1
    if request.frames is not None:
        return request.frames
    value = request.extra.get(key, call_signature(model.pipeline_class)[key].default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def check_model_request(model: ModelInfo, request: GenerateRequest, names: Names = CALL_NAMES) -> None:
    """Refuse (ConfigError, one line naming the field) what this pipeline cannot run: everything but the output."""
    check_request(model, request, {k: v for k, v in names.items() if k in REQUEST_NAMES})
    # model_index.json's values against the pipeline's __init__ (and required components saved as null)
    pipeline_init_values(model, pipeline_class(model))
    check_call(model, request, names)
    check_limits(model, request, names, call_signature(model.pipeline_class))


def check_run(model: ModelInfo, request: GenerateRequest, output: Path, *, overwrite: bool,
              fps: float | None = None, names: Names = CALL_NAMES, output_name: str = "--output",
              fps_name: str = "--fps") -> CheckedRun:
    """Refuse (ConfigError, one line) what this pipeline cannot run or the output cannot hold."""
    check_model_request(model, request, names)
    video = makes_video(model)
    audio = audio_only(pipeline_class(model))
    if fps is not None and not video:
        made = "audio" if audio else "still images"
        raise ConfigError(f"{fps_name}: {model.pipeline_class} makes {made} (no frame rate)")
    target = check_output(output, overwrite=overwrite, flag=output_name, video=video,
                          frames=expected_frames(model, request), audio=audio)
    return CheckedRun(request, target, video, fps)
