"""Check a request's pipeline options against the pipeline's own call signature, before load.

diffusers pipelines disagree on what they take: Flux has no number of frames, Wan no image, and a
misspelt keyword is a `TypeError` only after every weight is loaded. Here the signature of the
pipeline class's `__call__` (the class `model_index.json` names, already verified to be a diffusers
pipeline by discovery) decides, before anything loads:

- which dedicated options the pipeline takes (`accepted_options`);
- whether each `--param KEY=VALUE` names a parameter (else a "did you mean" suggestion) and whether
  its value fits the parameter's annotation (int, float, bool, str, None, lists and unions of those;
  what cannot be checked that simply is accepted);
- the number of frames each video family can render exactly (`frame_counts.frames_rule`): diffusers rounds a count
  it cannot take (Wan) or renders another one without a word (LTX, CogVideoX, Mochi, HunyuanVideo),
  so a count the pipeline would change is refused with the nearest ones it takes (the tests render
  every count of a range with plain diffusers and compare);
- a conditioning image: the pipeline has an image parameter, and the file opens as an image.
"""

from __future__ import annotations

import collections.abc
import inspect
import json
import math
import re
import types
import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..model_dir.discovery import ModelInfo
from ..model_dir.trusted_classes import pipeline_class
from ..plain_text import plain
from .call_inputs import check_required_inputs
from .frame_counts import check_frames
from .guider_guidance import guidance_through_guider
from .param_syntax import ENGINE_PARAMETERS, check_finite, unknown_parameter_line
from .pipeline_needs import check_pipeline_needs
from .pipeline_output import audio_only, check_output_kind
from .render_size import check_decodable, check_render_size
from .runner import FRAME_PARAMETERS, IMAGE_PARAMETERS, GenerateRequest, pipeline_parameter
from .step_schedules import check_step_schedules
from .strength_steps import check_strength
from .text_length import check_text_length

# Dedicated request fields -> the pipeline parameters they set (the first one the pipeline has).
OPTION_PARAMETERS: dict[str, tuple[str, ...]] = {
    "steps": ("num_inference_steps",),
    "height": ("height",),
    "width": ("width",),
    "guidance": ("guidance_scale",),
    "frames": FRAME_PARAMETERS,
    "negative_prompt": ("negative_prompt",),
    "max_sequence_length": ("max_sequence_length",),
    "image": IMAGE_PARAMETERS,
}
OPTION_LABELS = {"steps": "steps", "height": "height", "width": "width", "guidance": "guidance", "frames": "frames",
                 "negative_prompt": "negative prompt", "max_sequence_length": "max sequence length",
                 "image": "image", "param": "param"}
# What each option is, for "PIPELINE takes no ..." lines.
OPTION_NOUNS = {"steps": "number of steps", "height": "height", "width": "width", "guidance": "guidance scale",
                "frames": "number of frames", "negative_prompt": "negative prompt",
                "max_sequence_length": "max sequence length", "image": "conditioning image"}
# Frame rates of families whose pipeline call and docs name none (the model card's rate).
FAMILY_FPS = (("Mochi", 30.0),)
_EXPORT_FPS = re.compile(r"export_to_video\([^)]*\bfps\s*=\s*(\d+(?:\.\d+)?)")


# ------------------------------------------------------------------------------------------ signature
@cache
def _pipeline_type(name: str) -> type:
    return pipeline_class(name, "model_index.json")


@cache
def call_signature(pipeline_class_name: str) -> dict[str, inspect.Parameter]:
    """The keyword parameters of the diffusers pipeline's `__call__` (annotations resolved where possible)."""
    call = _pipeline_type(pipeline_class_name).__call__
    try:
        signature = inspect.signature(call, eval_str=True)
    except Exception:  # an annotation that does not evaluate: keep it as written (then it is not checked)
        signature = inspect.signature(call)
    return {name: p for name, p in signature.parameters.items()
            if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def makes_audio_only(pipeline_class_name: str) -> bool:
    """Whether the pipeline's declared output is audio and no picture (its result is a .wav or .flac)."""
    return audio_only(_pipeline_type(pipeline_class_name))


def option_parameter(signature: Mapping[str, Any], option: str) -> str | None:
    """The pipeline parameter a dedicated option sets (None: the pipeline has none)."""
    return pipeline_parameter(signature, OPTION_PARAMETERS[option])


def accepted_options(pipeline_class_name: str, model: ModelInfo | None = None) -> set[str]:
    """The dedicated options (`frames`, `negative_prompt`, `max_sequence_length`, `image`, `guidance`,
    `steps`, `height`, `width`) the pipeline takes (with `model`: `guidance` also where its guiders take it)."""
    signature = call_signature(pipeline_class_name)
    options = {option for option in OPTION_PARAMETERS if option_parameter(signature, option) is not None}
    if model is not None and guidance_through_guider(model, signature):
        options.add("guidance")
    return options


def _guider_note(model: ModelInfo) -> str:
    """A pipeline that guides through a `guider` component whose class takes no guidance scale: the refusal
    says where its guidance comes from, rather than that it has none (a guider that takes one is set by
    `--guidance`: `guider_guidance`)."""
    guider = next((c for c in model.components if c.name == "guider"), None)
    if guider is None:
        return ""
    return (f" argument: its guidance comes from its guider component ({plain(guider.class_name or '?')}), "
            f"which takes no guidance_scale; leave --guidance out")


# ------------------------------------------------------------------------------------------ --param
_UNCHECKED = None  # "cannot tell": accepted


def value_fits(value: Any, annotation: Any) -> bool | None:
    """True/False when the annotation is one of the simple kinds, None when it cannot be checked simply."""
    if annotation is inspect.Parameter.empty or annotation is Any or isinstance(annotation, str):
        return _UNCHECKED
    if annotation is None or annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        verdicts = [value_fits(value, arm) for arm in typing.get_args(annotation)]
        if any(v is True for v in verdicts):
            return True
        return _UNCHECKED if any(v is None for v in verdicts) else False
    if origin in (list, tuple, collections.abc.Sequence):
        if not isinstance(value, list):
            return False
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        if len(args) != 1:
            return _UNCHECKED if args else True
        verdicts = [value_fits(item, args[0]) for item in value]
        return False if any(v is False for v in verdicts) else (True if all(verdicts) else _UNCHECKED)
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if annotation in (list, tuple):
        return isinstance(value, list)
    if isinstance(value, dict | list) and isinstance(annotation, type) and typing.get_origin(annotation) is None \
            and not annotation.__module__.startswith(("torch", "numpy", "PIL")):
        # a JSON object or array is never an instance of another class (LTX-2's `conditions:
        # LTX2VideoCondition` given a dict failed after load); a string or number may be what a class takes;
        # tensors, arrays and images are refused with their own line (`request_limits`)
        return isinstance(value, annotation)
    return _UNCHECKED


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if not typing.get_args(annotation) else None
    return text or str(annotation).replace("typing.", "")


def _check_params(model: ModelInfo, params: Mapping[str, Any], label: str,
                  signature: Mapping[str, inspect.Parameter], flag_of: Mapping[str, str]) -> None:
    dedicated = {parameter: option for option, parameters in OPTION_PARAMETERS.items() for parameter in parameters}
    for key, value in params.items():
        if key in ENGINE_PARAMETERS:
            raise ConfigError(f"{label} {key}: set by the engine itself, not by a parameter")
        if key not in signature:
            raise ConfigError(unknown_parameter_line(model.pipeline_class, key, frozenset(signature), label))
        if key in dedicated:
            raise ConfigError(f"{label} {key}: use {flag_of[dedicated[key]]} for {OPTION_NOUNS[dedicated[key]]}")
        if value_fits(value, signature[key].annotation) is False:
            raise ConfigError(f"{label} {key}={json.dumps(value)[:60]}: {model.pipeline_class} takes "
                              f"{_type_name(signature[key].annotation)} for {key}")


# ------------------------------------------------------------------------------------------ image
def _check_image(path: Path, label: str) -> None:
    from PIL import Image, UnidentifiedImageError

    try:
        if not path.is_file():
            raise ConfigError(f"{label} {path}: no such file" if not path.exists() else f"{label} {path}: not a file")
        with Image.open(path) as image:
            image.load()  # the whole file: a truncated one fails here, not after the model has loaded
    except ConfigError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError) as exc:
        raise ConfigError(f"{label} {path}: not an image PIL can read ({type(exc).__name__})") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise ConfigError(f"{label} {path}: cannot be read as an image ({str(exc).splitlines()[0][:80]})") from None


# ------------------------------------------------------------------------------------------ text length
def _check_text_length(model: ModelInfo, request: GenerateRequest, label: str,
                       signature: Mapping[str, inspect.Parameter]) -> None:
    parameter = signature.get("max_sequence_length")
    if parameter is not None:  # the rule and its line are `text_length`'s, which `plan` applies too
        check_text_length(model, request.max_sequence_length, parameter.default, label)


# ------------------------------------------------------------------------------------------ check_call
def _requested_options(request: GenerateRequest) -> dict[str, Any]:
    return {option: value for option in OPTION_PARAMETERS if (value := getattr(request, option)) is not None}


def check_call(model: ModelInfo, request: GenerateRequest, labels: Mapping[str, str] | None = None) -> None:
    """Refuse, with one line naming the option (`labels` maps field -> what the user typed, e.g. "--frames";
    "param" or "params" for the `--param` values), what the pipeline's call would not take, before anything
    loads: an option it has no parameter for, a bad frame count, an unreadable image, an unknown or ill-typed
    parameter, a text length its transformer cannot take, a size it would render differently
    (`render_size`), an optional package its code uses unchecked (`pipeline_needs`), an image-to-image strength
    that diffusers refuses or that runs no step (`strength_steps`)."""
    names = {**OPTION_LABELS, **(labels or {})}
    if labels and "param" not in labels and "params" in labels:  # the request's field is `params`
        names["param"] = labels["params"]
    signature = call_signature(model.pipeline_class)
    for option, value in _requested_options(request).items():
        if option == "guidance" and guidance_through_guider(model, signature):
            continue  # set on its guiders at the call (`guider_guidance.guided`)
        if option_parameter(signature, option) is None:
            raise ConfigError(f"{names[option]}: {model.pipeline_class} takes no {OPTION_NOUNS[option]}"
                              + (_guider_note(model) if option == "guidance" else ""))
        if option == "frames":
            check_frames(model, int(value), names["frames"])
        elif option == "max_sequence_length" and value < 1:
            raise ConfigError(f"{names[option]} {value}: must be at least 1")
        elif option == "image":
            _check_image(Path(value), names["image"])
    check_finite(request.params, names["param"])
    _check_params(model, request.params, names["param"], signature, names)
    given = {*request.explicit_kwargs(signature), *request.params, *request.extra}
    check_required_inputs(model.pipeline_class, signature, given, names)
    check_strength(_pipeline_type(model.pipeline_class), signature, request.steps, request.params, names)
    check_step_schedules(model.pipeline_class, signature, request.steps, request.guidance, request.params, names)
    check_output_kind(_pipeline_type(model.pipeline_class))
    _check_text_length(model, request, names["max_sequence_length"], signature)
    check_render_size(model, request, names, signature)
    check_decodable(model)
    check_pipeline_needs(model)


def check_shape(model: ModelInfo, request: GenerateRequest, labels: Mapping[str, str] | None = None) -> None:
    """The request's frame count and rendered size only, as `check_call` checks them (what `plan
    --height/--width/--frames` forecasts for; the sizes' multiples are `request_checks.check_request`'s)."""
    names = {**OPTION_LABELS, **(labels or {})}
    signature = call_signature(model.pipeline_class)
    if request.frames is not None:
        if option_parameter(signature, "frames") is None:
            raise ConfigError(f"{names['frames']}: {model.pipeline_class} takes no {OPTION_NOUNS['frames']}")
        check_frames(model, request.frames, names["frames"])
    check_render_size(model, request, names, signature)


# ------------------------------------------------------------------------------------------ fps
def _call_default_fps(signature: Mapping[str, inspect.Parameter]) -> float | None:
    for key in ("frame_rate", "fps"):
        parameter = signature.get(key)
        if parameter is not None and isinstance(parameter.default, int | float) \
                and not isinstance(parameter.default, bool) and parameter.default > 0:
            return float(parameter.default)
    return None


@cache
def _documented_fps(pipeline_class_name: str) -> float | None:
    module = inspect.getmodule(_pipeline_type(pipeline_class_name))
    example = getattr(module, "EXAMPLE_DOC_STRING", None)
    match = _EXPORT_FPS.search(example) if isinstance(example, str) else None
    return float(match.group(1)) if match else None


def requested_fps(request: GenerateRequest) -> float | None:
    """The frame rate the request passes the pipeline itself (`--param frame_rate=…` or `fps=…`): the
    video is written at it, so a pipeline that times its audio by it (LTX-2) stays in step with it."""
    for key in ("frame_rate", "fps"):
        value = request.params.get(key, request.extra.get(key))
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
            return float(value)
    return None


def default_fps(model: ModelInfo) -> float | None:
    """The frame rate a video is written at unless the operator says: the pipeline call's own `frame_rate`
    or `fps` default, else the rate the pipeline's documented example exports at, else the family's."""
    name = model.pipeline_class
    try:
        signature = call_signature(name)
    except ConfigError:
        return None
    fps = _call_default_fps(signature) or _documented_fps(name)
    if fps is None:
        fps = next((rate for prefix, rate in FAMILY_FPS if name.startswith(prefix)), None)
    return fps
