"""Pipelines that render a size of their own whatever is asked, stated before load.

- Kandinsky 5 T2I renders only the sizes of its `resolutions` list (set in its `__init__`, 1024x1024
  and six other aspect ratios): any other size is replaced by the nearest aspect ratio's, with a log
  line only. A size not in the list is refused, naming the list.
- HiDream-I1 scales every request to the area of its default size (`default_sample_size` 128 latents
  times the VAE factor per side: 1024x1024 for the released VAE), keeping the aspect ratio: a size
  that would change is refused, naming the size it would render.
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


def check_fixed_sizes(model: ModelInfo, height: int | None, width: int | None, names: Mapping[str, str]) -> None:
    """Refuse (one line) a size the pipeline would replace by one of its own."""
    name = model.pipeline_class
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
