"""Pipelines that render a size of their own whatever is asked, stated before load.

- Kandinsky 5 T2I renders only the sizes of its `resolutions` list (set in its `__init__`, 1024x1024
  and six other aspect ratios): any other size is replaced by the nearest aspect ratio's, with a log
  line only. A size not in the list is refused, naming the list.
- HiDream-I1 scales every request to the area of its default size (`default_sample_size` 128 latents
  times the VAE factor per side: 1024x1024 for the released VAE), keeping the aspect ratio: a size
  that would change is refused, naming the size it would render.
- PRX bins every request (`use_resolution_binning`, on by default) to the nearest aspect ratio of its
  `default_sample_size` table (512 px: 64x64 is rendered at 512x512) and resizes the image back: a size
  it would render otherwise is refused, naming that size and `--param use_resolution_binning=false`
  (which renders the size asked for); a `default_sample_size` without a table fails in the pipeline
  after load, so binning on for it is refused too.
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
from collections.abc import Mapping
from functools import cache

from ..errors import ConfigError
from ..model_dir.discovery import ModelInfo
from ..model_dir.weights import load_json

HIDREAM_SAMPLE_SIZE = 128  # HiDreamImagePipeline.default_sample_size, set in its __init__


@cache
def listed_resolutions(pipeline_class_name: str) -> tuple[tuple[int, int], ...] | None:
    """The `self.resolutions = [(width, height), ...]` literal of the pipeline's `__init__` (None: none)."""
    import diffusers

    cls = getattr(diffusers, pipeline_class_name, None)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    except (TypeError, OSError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "resolutions"
                                                for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            if all(isinstance(p, tuple) and len(p) == 2 and all(isinstance(v, int) for v in p) for p in value):
                return tuple(value)
    return None


def _vae_factor(model: ModelInfo) -> int:
    vaes = model.by_role("vae")
    config = load_json(vaes[0].folder / "config.json") if vaes and (vaes[0].folder / "config.json").is_file() else {}
    blocks = config.get("block_out_channels")
    return 2 ** (len(blocks) - 1) if isinstance(blocks, list) and 0 < len(blocks) <= 16 else 8


def hidream_rendered(height: int, width: int, factor: int) -> tuple[int, int]:
    """(height, width) as HiDreamImagePipeline.__call__ computes them (diffusers 0.42)."""
    side = HIDREAM_SAMPLE_SIZE * factor
    division = factor * 2
    scale = math.sqrt(side * side / (width * height))
    return int(height * scale // division * division), int(width * scale // division * division)


PRX_DEFAULT_RESOLUTION = 512  # diffusers.pipelines.prx.pipeline_prx.DEFAULT_RESOLUTION


def prx_rendered(model: ModelInfo, height: int | None, width: int | None) -> tuple[int, int] | None:
    """(height, width) PRXPipeline.__call__ renders with binning on (diffusers 0.42); None: no table for its
    `default_sample_size` (the call raises)."""
    from diffusers.pipelines.prx.pipeline_prx import ASPECT_RATIO_BINS

    index = model.path / "model_index.json"
    sample = (load_json(index).get("default_sample_size") if index.is_file() else None) or PRX_DEFAULT_RESOLUTION
    bins = ASPECT_RATIO_BINS.get(sample) if isinstance(sample, int) else None
    if bins is None:
        return None
    h, w = height or sample, width or sample
    closest = min(bins, key=lambda ratio: abs(float(ratio) - h / w))
    return int(bins[closest][0]), int(bins[closest][1])


def _check_prx(model: ModelInfo, height: int | None, width: int | None, names: Mapping[str, str]) -> None:
    rendered = prx_rendered(model, height, width)
    off = f"{names.get('param', '--param')} use_resolution_binning=false"
    if rendered is None:
        raise ConfigError(f"{model.pipeline_class}'s resolution binning has no table for its default_sample_size "
                          f"(it would fail after load); pass {off}")
    if height is not None and width is not None and rendered != (height, width):
        raise ConfigError(f"{names['height']} {height} {names['width']} {width}: {model.pipeline_class} would render "
                          f"{rendered[1]}x{rendered[0]} and resize it to {width}x{height} (resolution binning); "
                          f"pass {off} to render {width}x{height}, or ask for {rendered[1]}x{rendered[0]}")


def check_fixed_sizes(model: ModelInfo, height: int | None, width: int | None, names: Mapping[str, str],
                      binning: object = True) -> None:
    """Refuse (one line) a size the pipeline would replace by one of its own (`binning`: the request's
    `use_resolution_binning`, for PRX)."""
    name = model.pipeline_class
    if name.startswith("PRX"):
        if binning:  # the pipeline tests its truth: `if use_resolution_binning:`
            _check_prx(model, height, width, names)
        return
    asked = f"{names['height']} {height} {names['width']} {width}"
    if name.startswith("HiDreamImage") and height is not None and width is not None:
        rendered = hidream_rendered(height, width, _vae_factor(model))
        if rendered != (height, width):
            side = HIDREAM_SAMPLE_SIZE * _vae_factor(model)
            raise ConfigError(f"{asked}: {name} would render {rendered[1]}x{rendered[0]} (it scales every request "
                              f"to {side}x{side} pixels' area, keeping the aspect ratio); ask for that size")
        return
    resolutions = listed_resolutions(name) if name.startswith("Kandinsky5") else None
    if resolutions is None or (height is None and width is None):
        return
    if (width, height) not in resolutions:
        sizes = ", ".join(f"{w}x{h}" for w, h in resolutions)
        raise ConfigError(f"{asked}: {name} renders only {sizes} (width x height; any other size is replaced by "
                          "the nearest aspect ratio's); pass one of them")
