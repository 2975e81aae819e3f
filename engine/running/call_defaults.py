"""Call values the engine sets where the pipeline's own default would fail, as diffusers' tests set them.

PixArt's resolution binning (on by default) snaps a request to a table of sizes chosen by the
transformer's `sample_size`; a `sample_size` with no table (8 in diffusers' own fast tests) makes the
call raise "Invalid sample size" after every weight has loaded. Diffusers runs such a model with
binning off, which renders exactly the size asked for; so does the engine. A request that turns
binning on for it anyway (`--param use_resolution_binning=true`) is refused before load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..errors import ConfigError
from ..model_dir.discovery import ModelInfo
from ..model_dir.weights import load_json
from .runner import GenerateRequest

BINNING = "use_resolution_binning"
PIXART_BIN_SIZES: dict[str, tuple[int, ...]] = {
    "PixArtAlphaPipeline": (32, 64, 128),
    "PixArtSigmaPipeline": (32, 64, 128, 256),
    "PixArtSigmaPAGPipeline": (32, 64, 128, 256),
}
"""The transformer sample sizes each PixArt pipeline's binning has a table for (diffusers 0.42)."""


def _sample_size(model: ModelInfo) -> object:
    for dit in model.dits:
        path = dit.folder / "config.json"
        return load_json(path).get("sample_size") if path.is_file() else None
    return None


def binning_table(model: ModelInfo) -> tuple[int, ...] | None:
    """The sample sizes this pipeline's resolution binning knows; None for a pipeline that does not bin."""
    if not model.pipeline_class.startswith("PixArt"):
        return None
    return PIXART_BIN_SIZES.get(model.pipeline_class, PIXART_BIN_SIZES["PixArtSigmaPipeline"])


def call_defaults(model: ModelInfo) -> dict[str, Any]:
    """Call values that replace a pipeline default that would fail for this model (empty for most)."""
    table = binning_table(model)
    if table is not None and _sample_size(model) not in table:
        return {BINNING: False}
    return {}


def with_call_defaults(model: ModelInfo, request: GenerateRequest) -> GenerateRequest:
    """`request` with `call_defaults` under its own built-in defaults (its `extra` and `params` win)."""
    defaults = call_defaults(model)
    return replace(request, extra={**defaults, **request.extra}) if defaults else request


def check_binning(model: ModelInfo, request: GenerateRequest, names: Mapping[str, str]) -> None:
    """Refuse binning asked for where the pipeline has no table for the transformer's sample size."""
    table = binning_table(model)
    if table is None:
        return
    value = request.params.get(BINNING, request.extra.get(BINNING, call_defaults(model).get(BINNING, True)))
    sample_size = _sample_size(model)
    if value and sample_size not in table:  # the pipeline tests its truth: `if use_resolution_binning:`
        raise ConfigError(f"{names.get('param', '--param')} {BINNING}={value!r:.20}: {model.pipeline_class}'s "
                          f"resolution binning has no table for a transformer sample_size of {sample_size!r:.20} "
                          f"(it has for {', '.join(map(str, table))}); leave it off to render the size asked for")
