"""`run`'s request flags → a checked `GenerateRequest` and output target, before anything loads.

Two stages, because some checks need the model and some do not: `parse_option_flags` reads what the
flags alone decide (`--param KEY=VALUE` syntax, `--fps`), before the model is even looked for;
`checked_request` then checks the request against the discovered pipeline (sizes, its call signature,
whether it makes videos) and the output against what the result will be (suffix for a video or an
image, every file a numbered sequence would write), still before any weight loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..engine.api import (
    GenerateRequest,
    ModelInfo,
    OutputTarget,
    call_signature,
    check_call,
    check_limits,
    check_output,
    check_request,
    option_parameter,
    pipeline_class,
    pipeline_init_values,
)
from ..engine.errors import ConfigError
from .run_flags import OptionFlags

REQUEST_FLAGS = {"steps": "--steps", "height": "--height", "width": "--width", "seed": "--seed",
                 "guidance": "--guidance"}
CALL_FLAGS = {**REQUEST_FLAGS, "frames": "--frames", "negative_prompt": "--negative-prompt",
              "max_sequence_length": "--max-sequence-length", "image": "--image", "param": "--param"}


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


@dataclass(frozen=True, slots=True)
class CheckedRun:
    request: GenerateRequest
    output: OutputTarget
    video: bool


def check_model_request(model: ModelInfo, request: GenerateRequest) -> None:
    """Refuse (ConfigError, one line naming the flag) what this pipeline cannot run: the request checks
    `run` and `plan` share (console/plan_request.py), everything but the output."""
    check_request(model, request, REQUEST_FLAGS)
    # model_index.json's values against the pipeline's __init__ (and required components saved as null)
    pipeline_init_values(model, pipeline_class(model))
    check_call(model, request, CALL_FLAGS)
    check_limits(model, request, CALL_FLAGS, call_signature(model.pipeline_class))


def checked_request(model: ModelInfo, request: GenerateRequest, options: OptionFlags, output: Path, *,
                    overwrite: bool) -> CheckedRun:
    """Refuse (ConfigError, one line naming the flag) what this pipeline cannot run or the output cannot hold."""
    check_model_request(model, request)
    video = makes_video(model)
    if options.fps is not None and not video:
        raise ConfigError(f"--fps: {model.pipeline_class} makes still images (no frame rate)")
    target = check_output(output, overwrite=overwrite, video=video, frames=expected_frames(model, request))
    return CheckedRun(request, target, video)
