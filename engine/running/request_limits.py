"""Limits of a request that would otherwise show only after the load, or never end in a line at all.

`call_options` checks a request against the pipeline's call signature; these are the limits a
signature does not say: how long a text the tokenizers take (a billion tokens grows until the
kernel kills the process), how many frames any video DiT renders in one call, parameters whose
value must be a tensor or an image (a `--param` value is JSON, so it never is), a batch of several
images per prompt (`run` writes one result), and a noise schedule that sets the step count.
All are checked before anything loads, each refusal one line naming the flag.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ..model_dir.discovery import ModelInfo
from ..model_dir.weights import ModelDirError, load_json
from .call_options import value_fits
from .runner import GenerateRequest

MAX_TEXT_TOKENS = 8192  # when no tokenizer names its own limit: far above any text encoder's positions
MAX_FRAMES = 4096  # frames in one call: video DiTs render a few hundred at most
MAX_STEPS = 10_000
BATCH_PARAMETERS = ("num_images_per_prompt", "num_videos_per_prompt")
SCHEDULE_PARAMETERS = ("sigmas", "timesteps")


def text_token_limit(model: ModelInfo) -> int:
    """The longest text the pipeline's tokenizers take: the largest `model_max_length` of them, where a
    tokenizer with none of its own up to `MAX_TEXT_TOKENS` (the "no limit" sentinel transformers writes, or
    Qwen2.5-VL's 131,072) counts as `MAX_TEXT_TOKENS`: Kandinsky 5's Qwen text is not held to its CLIP
    tokenizer's 77 tokens. `MAX_TEXT_TOKENS` where no tokenizer says."""
    limits = []
    for component in model.components:
        config = component.folder / "tokenizer_config.json"
        if component.has_weights or not config.is_file():
            continue
        try:
            value = load_json(config).get("model_max_length")
        except ModelDirError:
            continue  # discovery read it already; a problem there was its to report
        own = isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_TEXT_TOKENS
        limits.append(value if own else MAX_TEXT_TOKENS)
    return max(limits, default=MAX_TEXT_TOKENS)


def _non_json_kinds(annotation: Any) -> list[str]:
    """Names of the tensor/array/image kinds an annotation takes (empty: JSON can express it)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType or origin in (list, tuple):
        return [k for arm in typing.get_args(annotation) for k in _non_json_kinds(arm)]
    name = getattr(annotation, "__name__", "")
    module = getattr(annotation, "__module__", "")
    if module.startswith(("torch", "numpy", "PIL")) or name in ("Tensor", "ndarray", "Image"):
        return [name or str(annotation)]
    return []


def check_limits(model: ModelInfo, request: GenerateRequest, labels: Mapping[str, str],
                 signature: Mapping[str, inspect.Parameter]) -> None:
    """Refuse (ConfigError, one line naming the flag as `labels` spells it) what would fail only after the
    load: see the module docstring."""
    if request.max_sequence_length is not None and "max_sequence_length" in signature:
        limit = text_token_limit(model)
        if request.max_sequence_length > limit:
            raise ConfigError(f"{labels['max_sequence_length']} {request.max_sequence_length}: the pipeline's "
                              f"tokenizers take at most {limit} tokens")
    if request.frames is not None and request.frames > MAX_FRAMES:
        raise ConfigError(f"{labels['frames']} {request.frames}: at most {MAX_FRAMES} frames in one request")
    if request.steps is not None and request.steps > MAX_STEPS:
        raise ConfigError(f"{labels['steps']} {request.steps}: at most {MAX_STEPS} steps")
    label = labels.get("param", "--param")
    for key, value in request.params.items():
        if key in BATCH_PARAMETERS and value not in (None, 1):
            raise ConfigError(f"{label} {key}={value!r:.20}: a request makes one image or video (run it again "
                              "with another --seed for more)")
        annotation = signature[key].annotation if key in signature else None
        kinds = _non_json_kinds(annotation) if annotation is not None else []
        if kinds and value is not None and value_fits(value, annotation) is not True:
            article = "an" if kinds[0][:1].lower() in "aeiou" else "a"
            raise ConfigError(f"{label} {key}: {model.pipeline_class} takes {article} {kinds[0]} there, which a "
                              "--param value (JSON) cannot give")


def schedule_steps(steps: int | None, params: Mapping[str, Any], steps_label: str = "--steps",
                   param_label: str = "--param") -> int | None:
    """The step count a `sigmas`/`timesteps` list sets (the pipeline runs one step per value), or `steps`.

    Given both, they must agree: otherwise progress would count to the wrong total ("step 4973/2")."""
    for key in SCHEDULE_PARAMETERS:
        values = params.get(key)
        if not isinstance(values, list):
            continue
        if not values:
            raise ConfigError(f"{param_label} {key}: an empty schedule (one value per step is needed)")
        if len(values) > MAX_STEPS:
            raise ConfigError(f"{param_label} {key}: {len(values)} values, at most {MAX_STEPS} steps")
        if steps is not None and steps != len(values):
            raise ConfigError(f"{param_label} {key} has {len(values)} values but {steps_label} is {steps} "
                              "(one step per value: leave out --steps)")
        return len(values)
    return steps
