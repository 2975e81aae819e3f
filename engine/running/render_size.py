"""The size a pipeline will really render, where that is not simply the size asked for — before load.

`request_checks.size_rule` says which sizes a pipeline takes (multiples, a cap). Two more ways a
request ends up at another size, or failing after every weight has loaded, come from the pipeline's
call signature, read here:

- a pipeline whose `__call__` takes `max_area` (Flux Kontext) scales every request to that many
  pixels, keeping the aspect ratio and flooring to its multiple, and only logs a warning: 64x64 is
  rendered at 1024x1024. A size it would change is refused, naming the size it would render and the
  `max_area` that renders the one asked for;
- a size the request leaves out takes the signature's default (AuraFlow: 1024), which may be more
  than the transformer's position embeddings hold: refused, asking for the size;
- a VAE that cannot decode as `from_pretrained` leaves it (Allegro's decodes only with tiling, which
  is off after a load): every request would fail at its last phase, so it is refused before load.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ..model_dir.discovery import ModelInfo
from .fixed_sizes import check_fixed_sizes
from .request_checks import SizeRule, size_rule
from .runner import GenerateRequest

AREA_PARAMETER = "max_area"
TILED_DECODE_ONLY = ("AutoencoderKLAllegro",)
"""VAE classes whose `decode` raises NotImplementedError unless tiling is enabled (diffusers 0.42)."""


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def area_resized(height: int, width: int, max_area: int, multiple: int) -> tuple[int, int]:
    """(height, width) as a `max_area` pipeline computes them: the aspect ratio kept at max_area pixels,
    each side floored to `multiple` (diffusers' FluxKontextPipeline.__call__, step 0)."""
    aspect = width / height
    new_width = round((max_area * aspect) ** 0.5)
    new_height = round((max_area / aspect) ** 0.5)
    return new_height // multiple * multiple, new_width // multiple * multiple


def _call_value(request: GenerateRequest, key: str, signature: Mapping[str, inspect.Parameter]) -> Any:
    if key in request.params:
        return request.params[key]
    if key in request.extra:
        return request.extra[key]
    return signature[key].default


def _check_max_area(model: ModelInfo, request: GenerateRequest, names: Mapping[str, str],
                    signature: Mapping[str, inspect.Parameter], rule: SizeRule) -> None:
    if AREA_PARAMETER not in signature or request.height is None or request.width is None:
        return
    area = _int(_call_value(request, AREA_PARAMETER, signature))
    if area is None:
        return
    asked = (request.height, request.width)
    multiple = rule.height_multiple
    rendered = area_resized(*asked, area, multiple)
    if rendered == asked:
        return
    exact = request.height * request.width
    hint = (f"; pass {names['param']} {AREA_PARAMETER}={exact} to render {asked[1]}x{asked[0]}"
            if area_resized(*asked, exact, multiple) == asked else "")
    raise ConfigError(f"{names['height']} {asked[0]} {names['width']} {asked[1]}: {model.pipeline_class} would "
                      f"render {rendered[1]}x{rendered[0]} (it scales every request to {AREA_PARAMETER} = "
                      f"{area} pixels){hint}")


def _check_defaults(model: ModelInfo, request: GenerateRequest, names: Mapping[str, str],
                    signature: Mapping[str, inspect.Parameter], rule: SizeRule) -> None:
    for key, cap in (("height", rule.max_height), ("width", rule.max_width)):
        parameter = signature.get(key)
        if getattr(request, key) is not None or parameter is None or cap is None:
            continue
        default = _int(request.extra.get(key, parameter.default))
        if default is not None and default > cap:
            raise ConfigError(f"{names[key]}: {model.pipeline_class}'s default {default} is more than it takes "
                              f"(at most {cap}: the transformer's position embeddings end there); "
                              f"pass {names[key]} {cap} or less")


def _default(signature: Mapping[str, inspect.Parameter], key: str) -> object:
    parameter = signature.get(key)
    return parameter.default if parameter is not None else None


def check_render_size(model: ModelInfo, request: GenerateRequest, names: Mapping[str, str],
                      signature: Mapping[str, inspect.Parameter]) -> None:
    """Refuse (one line) a request the pipeline would render at another size, or fail on after load."""
    height = request.height if request.height is not None else _int(_default(signature, "height"))
    width = request.width if request.width is not None else _int(_default(signature, "width"))
    check_fixed_sizes(model, height, width, names, request.params.get("use_resolution_binning",
                                                                   request.extra.get("use_resolution_binning", True)))
    rule = size_rule(model)
    if rule is None:
        return
    _check_defaults(model, request, names, signature, rule)
    _check_max_area(model, request, names, signature, rule)


def check_decodable(model: ModelInfo) -> None:
    """Refuse (one line) a pipeline whose VAE cannot decode as loaded: plain diffusers fails there too."""
    for vae in model.by_role("vae"):
        if vae.class_name in TILED_DECODE_ONLY:
            raise ConfigError(f"{vae.name} ({vae.class_name}): decodes only with tiling, which from_pretrained "
                              f"leaves off, so {model.pipeline_class} fails at its VAE decode (plain diffusers "
                              "too); not supported here")
