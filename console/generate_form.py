"""The generate dialog's fields and their checks, as plain data and functions (no widgets).

The dialog shows only what the loaded pipeline's `__call__` takes (a Flux pipeline has no frame
count, a text-to-video pipeline no input image), and an empty field sends nothing, so the pipeline's
own default applies; that default, read from its call signature, is the field's placeholder.
A request is checked here, against the pipeline's signature and the model's configs, before it
starts: a frame count Wan cannot take is a line under the fields, not a failure after the text
encoder has run.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..engine.api import GenerateRequest, ModelInfo, checks
from ..engine.errors import ConfigError

MakeRequest = Callable[..., GenerateRequest]
"""`default_request`-like: keyword prompt, steps, height, width, seed, guidance → a full request."""

InputKind = Literal["text", "integer", "number"]

PLAIN_LABELS = {"steps": "steps", "height": "height", "width": "width", "seed": "seed", "guidance": "guidance",
                "frames": "frames", "negative_prompt": "negative prompt",
                "max_sequence_length": "max sequence length", "image": "image", "param": "option",
                "cache": "step cache"}
"""How the checks name a field in the dialog (the CLI names its flags instead)."""


@dataclass(frozen=True, slots=True)
class FormField:
    """One row of the dialog."""

    id: str
    label: str
    value: str
    placeholder: str
    kind: InputKind = "text"


def _default_of(signature: Mapping[str, inspect.Parameter], option: str) -> Any:
    """The default of the pipeline parameter an option sets (None: no parameter, or no default)."""
    name = checks.option_parameter(signature, option)
    if name is None:
        return None
    default = signature[name].default
    return None if default is inspect.Parameter.empty else default


def _shown(value: Any) -> bool:
    return isinstance(value, int | float | str) and not isinstance(value, bool) and value != ""


def _placeholder(default: Any, fallback: str = "pipeline default") -> str:
    return f"{default} (pipeline default)" if _shown(default) else fallback


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def form_fields(accepted: set[str] | frozenset[str], defaults: GenerateRequest,
                signature: Mapping[str, inspect.Parameter], cache_kinds: tuple[str, ...] = ()) -> list[FormField]:
    """The dialog's rows for a pipeline taking `accepted` options, prefilled from `defaults`.

    Prompt and seed are always there (every pipeline call takes a prompt; the seed drives the
    generator). A prefilled value is the model's working default (the demo's); otherwise a field is
    empty and its placeholder says what the pipeline will use.
    """
    fields = [FormField("prompt", "prompt", defaults.prompt, "a prompt")]
    if "negative_prompt" in accepted:
        fields.append(FormField("negative_prompt", "negative", _text(defaults.negative_prompt),
                                "negative prompt (none)"))
    if "image" in accepted:  # image-to-video / image editing: the conditioning image, a file path
        fields.append(FormField("image", "image", _text(defaults.image), "path of the input image"))
    if "steps" in accepted:
        fields.append(FormField("steps", "steps", _text(defaults.steps), _placeholder(_default_of(signature, "steps")),
                                "integer"))
    if accepted & {"height", "width"}:
        size = f"{defaults.width}x{defaults.height}" if defaults.width and defaults.height else ""
        width, height = _default_of(signature, "width"), _default_of(signature, "height")
        default_size = f"{width}x{height}" if _shown(width) and _shown(height) else None
        fields.append(FormField("size", "size", size, _placeholder(default_size, "WxH (pipeline default)")))
    if "frames" in accepted:
        fields.append(FormField("frames", "frames", _text(defaults.frames),
                                _placeholder(_default_of(signature, "frames")), "integer"))
    fields.append(FormField("seed", "seed", str(defaults.seed), "0", "integer"))
    if "guidance" in accepted:
        fields.append(FormField("guidance", "guidance", _text(defaults.guidance),
                                _placeholder(_default_of(signature, "guidance")), "number"))
    if "max_sequence_length" in accepted:
        value = defaults.max_sequence_length or defaults.extra.get("max_sequence_length")
        fields.append(FormField("max_sequence_length", "max seq len", _text(value),
                                _placeholder(_default_of(signature, "max_sequence_length")), "integer"))
    if cache_kinds:  # diffusers' step caches this family's denoiser takes (none: no field)
        fields.append(cache_field(defaults, cache_kinds))
    return fields


def cache_field(defaults: GenerateRequest, kinds: tuple[str, ...]) -> FormField:
    """`KIND[:key=value,...]` as `--cache` takes it; empty or `off`: no cache."""
    return FormField("cache", "step cache", defaults.cache.text() if defaults.cache is not None else "",
                     f"off · {'/'.join(kinds)}")


def parse_cache_field(values: Mapping[str, str]) -> Any:
    """The dialog's step cache (a `CacheSpec`, or None for empty/off); a bad one: ConfigError naming the field."""
    text = values.get("cache", "").strip()
    try:
        return checks.parse_cache(text) if text else None
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("--cache", "step cache", 1)) from None


def parse_size(text: str) -> tuple[int | None, int | None]:
    """`WxH` or `N` (square); empty means the model's default. Raises ValueError with the reason."""
    text = text.strip().lower().replace("×", "x")
    if not text:
        return None, None
    parts = text.split("x")
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"size must be WxH or N, got {text!r}")
    width, height = (int(p) for p in parts)
    if width <= 0 or height <= 0:
        raise ValueError("size must be positive")
    return width, height


def _int(values: Mapping[str, str], key: str) -> int | None:
    text = values.get(key, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{PLAIN_LABELS.get(key, key)} must be a whole number, got {text!r}") from None


def _float(values: Mapping[str, str], key: str) -> float | None:
    text = values.get(key, "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{PLAIN_LABELS.get(key, key)} must be a number, got {text!r}") from None


def build_request(values: Mapping[str, str], make_request: MakeRequest) -> GenerateRequest:
    """The request from the fields' text (only the fields shown are in `values`); ValueError when one
    does not parse. An empty field sends nothing, so the pipeline's own default applies."""
    steps = _int(values, "steps")  # its range, like every other field's, is `check`'s job
    width, height = parse_size(values.get("size", ""))
    seed = _int(values, "seed") or 0
    request = make_request(prompt=values.get("prompt", ""), steps=steps, height=height, width=width, seed=seed,
                           guidance=_float(values, "guidance"))
    extra = dict(request.extra)
    if "max_sequence_length" in values:  # the field shows the working default; what it says now is sent
        extra.pop("max_sequence_length", None)
    image_text = values.get("image", "").strip()
    return dataclasses.replace(
        request, frames=_int(values, "frames"), negative_prompt=values.get("negative_prompt", "") or None,
        max_sequence_length=_int(values, "max_sequence_length"),
        image=Path(image_text).expanduser() if image_text else None, extra=extra, cache=parse_cache_field(values))


def check(model: ModelInfo, request: GenerateRequest) -> None:
    """Everything `run` checks before load, named as the dialog names its fields (ConfigError)."""
    checks.check_call(model, request, labels=PLAIN_LABELS)
    checks.check_request(model, request, labels=PLAIN_LABELS)


@dataclass(frozen=True, slots=True)
class RequestForm:
    """What the dialog needs: its rows, and how to turn their text into a checked request."""

    model: ModelInfo
    defaults: GenerateRequest
    make_request: MakeRequest
    accepted: frozenset[str]
    signature: Mapping[str, inspect.Parameter]
    cache_kinds: tuple[str, ...] = ()
    """The step-cache kinds diffusers takes on this family's denoiser (`checks.supported_kinds`)."""
    _cache_checked: dict[str, str] = field(default_factory=dict)
    """A cache setting's answer from diffusers ('' when it takes it), kept: the forecast rebuilds the request
    on every key."""

    @classmethod
    def for_model(cls, model: ModelInfo, defaults: GenerateRequest, make_request: MakeRequest,
                  cache_kinds: tuple[str, ...] = ()) -> RequestForm:
        pipeline = model.pipeline_class
        return cls(model, defaults, make_request, frozenset(checks.accepted_options(pipeline, model)),
                   checks.call_signature(pipeline), cache_kinds)

    def fields(self) -> list[FormField]:
        return form_fields(self.accepted, self.defaults, self.signature, self.cache_kinds)

    def build(self, values: Mapping[str, str]) -> GenerateRequest:
        """The checked request; ValueError (a field does not parse) or ConfigError (the pipeline or the
        model cannot take it), each one line naming the field."""
        request = build_request(values, self.make_request)
        check(self.model, request)
        self._check_cache(request.cache)
        return request

    def _check_cache(self, spec: Any) -> None:
        """diffusers takes the setting for this family (its parameter names and values too), as `run` checks."""
        if spec is None:
            return
        key = spec.text()
        if key not in self._cache_checked:
            try:
                checks.check_cache_support(self.model, spec)
                self._cache_checked[key] = ""
            except ConfigError as exc:
                self._cache_checked[key] = str(exc).replace("--cache", "step cache", 1)
        if self._cache_checked[key]:
            raise ConfigError(self._cache_checked[key])

    def frames_of(self, request: GenerateRequest) -> int | None:
        return frames_of(request, self.accepted, self.signature)


def frames_of(request: GenerateRequest, accepted: set[str] | frozenset[str],
              signature: Mapping[str, inspect.Parameter]) -> int | None:
    """How many frames the request will make (its own count or the pipeline's default); None when the
    pipeline makes images."""
    if "frames" not in accepted:
        return None
    if request.frames is not None:
        return request.frames
    default = _default_of(signature, "frames")
    return default if isinstance(default, int) else None


def expected_frames(model: ModelInfo, request: GenerateRequest) -> int | None:
    """`frames_of` for the model's pipeline (what the live screen announces when a request starts)."""
    pipeline = model.pipeline_class
    return frames_of(request, checks.accepted_options(pipeline), checks.call_signature(pipeline))
