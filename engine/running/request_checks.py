"""Check a generation request against the discovered model before anything loads.

diffusers pipelines disagree on what they do with a size they cannot take: SD3 and PixArt raise
only after every weight is loaded, Flux and Wan log a warning and silently render another size.
The rule each pipeline applies is derived here from the model's configs, the way the pipeline
derives it in its constructor and `check_inputs`:

- VAE spatial factor: `scale_factor_spatial` or `spatial_compression_ratio` where the VAE config
  has one (Wan, HunyuanVideo), else `patch_size * 2 ** sum(spatio_temporal_scaling)` for the LTX
  video VAE (as its constructor computes it), else `2 ** (len(block_out_channels) - 1)`
  (AutoencoderKL, CogVideoX); a pipeline without a VAE uses 8, as the pipelines do.
- times each DiT's spatial patch size (`patch_size`: an int, or a list whose last two items are
  the height and width patch);
- Flux-style pipelines pack latents into 2x2 patches: ×2 (`vae_scale_factor * 2`);
- PixArt's resolution binning where it has no table: engine/running/call_defaults.py turns it off;
- pipelines with a fixed divisor in `check_inputs` (PixArt: 8, Wan: 16, LTX-Video: 32, CogVideoX: 8,
  HunyuanVideo: 16, Mochi: 8, Sana and SanaVideo: 32) need that too;
- a DiT with learned position embeddings cropped to `pos_embed_max_size` caps the size: SD3 reads it as
  patches per side, AuraFlow as patches in all (a square grid), so the table's shape in the weights'
  header decides (`_embedded_side`);
- a pipeline that scales every request to `max_area` pixels (Flux Kontext) renders another size
  than asked unless the area matches: engine/running/render_size.py states it before load.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..model_dir.discovery import ComponentInfo, ModelInfo
from ..model_dir.weights import load_json, read_header
from .call_defaults import check_binning
from .runner import GenerateRequest

SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes an unsigned 64-bit seed
NO_VAE_FACTOR = 8  # what the pipelines assume when they have no VAE

# Pipelines whose check is `height % (vae_scale_factor * 2)`: latents packed into 2x2 patches.
PACKED_2X2_PREFIXES = ("Flux", "Chroma", "QwenImage")
# Pipelines whose `check_inputs` divides by a fixed number, whatever the configs say.
FIXED_DIVISORS = (("PixArt", 8), ("Wan", 16), ("LTX", 32), ("CogVideoX", 8), ("HunyuanVideo", 16), ("Mochi", 8),
                  ("Sana", 32))
POS_TABLE = "pos_embed.pos_embed"  # the learned position table of SD3 / AuraFlow-style DiTs

PLAIN_LABELS = {"steps": "steps", "height": "height", "width": "width", "seed": "seed", "guidance": "guidance"}


@dataclass(frozen=True, slots=True)
class SizeRule:
    """What image sizes a pipeline takes: multiples, and an upper bound where it has one."""

    pipeline: str
    height_multiple: int
    width_multiple: int
    max_height: int | None = None
    max_width: int | None = None


def _config(component: ComponentInfo) -> dict[str, Any]:
    path = component.folder / "config.json"
    return load_json(path) if path.is_file() else {}


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def vae_spatial_factor(model: ModelInfo) -> int | None:
    """Pixels per latent cell along height/width (None: the VAE's config does not say)."""
    vaes = [c for c in model.components if c.name == "vae"] or model.by_role("vae")
    if not vaes:
        return NO_VAE_FACTOR
    config = _config(vaes[0])
    for key in ("scale_factor_spatial", "spatial_compression_ratio"):
        if (factor := _positive_int(config.get(key))) is not None:
            return factor
    scaling = config.get("spatio_temporal_scaling")  # the LTX video VAE: patches, then 2x per scaling block
    if isinstance(scaling, list) and (patch := _positive_int(config.get("patch_size"))) is not None:
        return patch * 2 ** sum(bool(s) for s in scaling)
    for key in ("block_out_channels", "encoder_block_out_channels"):
        channels = config.get(key)
        if isinstance(channels, list) and channels:
            return 2 ** (len(channels) - 1)
    return None


def dit_patch(config: Mapping[str, Any]) -> tuple[int, int]:
    """(height patch, width patch) of a DiT config; 1 where it has no patch size (a UNet)."""
    patch = config.get("patch_size")
    if isinstance(patch, list | tuple) and patch:
        sizes = [_positive_int(p) or 1 for p in patch]
        return (sizes[-2], sizes[-1]) if len(sizes) >= 2 else (sizes[0], sizes[0])
    size = _positive_int(patch) or 1
    return size, size


def _embedded_side(dit: ComponentInfo) -> int | None:
    """Patches per side the DiT's learned position table holds, from its shape in the weights' header.

    `pos_embed_max_size` means patches per side for SD3's `PatchEmbed` (a table of size²) but patches in
    all for AuraFlow's (a table of size, viewed as a √size × √size grid): the table itself, (1, N, dim),
    settles it: either way a crop covers at most ⌊√N⌋ patches per side."""
    for file in dit.files:
        for tensor in read_header(file):
            if tensor.name == POS_TABLE and len(tensor.shape) == 3 and tensor.shape[0] == 1 and tensor.shape[1] > 0:
                return math.isqrt(tensor.shape[1])
    return None


def size_rule(model: ModelInfo) -> SizeRule | None:
    """The pipeline's size rule, or None when the configs do not determine it."""
    factor = vae_spatial_factor(model)
    if factor is None:
        return None
    name = model.pipeline_class
    packing = 2 if name.startswith(PACKED_2X2_PREFIXES) else 1
    fixed = next((divisor for prefix, divisor in FIXED_DIVISORS if name.startswith(prefix)), 1)
    height_m = width_m = math.lcm(factor * packing, fixed)
    max_height = max_width = None
    for dit in model.dits:
        config = _config(dit)
        ph, pw = dit_patch(config)
        height_m, width_m = math.lcm(height_m, factor * ph), math.lcm(width_m, factor * pw)
        if (cap := _positive_int(config.get("pos_embed_max_size"))) is not None:
            cap = min(cap, _embedded_side(dit) or cap)
            max_height = min(max_height or cap * ph * factor, cap * ph * factor)
            max_width = min(max_width or cap * pw * factor, cap * pw * factor)
    return SizeRule(name, height_m, width_m, max_height, max_width)


def _check_size(label: str, value: int | None, multiple: int | None, cap: int | None, rule: SizeRule | None) -> None:
    if value is None:
        return
    if value <= 0:
        raise ConfigError(f"{label} {value}: must be a positive number of pixels")
    if rule is None or multiple is None:
        return
    if value % multiple:
        below = value // multiple * multiple
        examples = f"{below} or {below + multiple}" if below else f"{multiple}"
        raise ConfigError(f"{label} {value}: {rule.pipeline} needs a multiple of {multiple} (e.g. {examples})")
    if cap is not None and value > cap:
        raise ConfigError(f"{label} {value}: {rule.pipeline} takes at most {cap} "
                          "(the transformer's position embeddings end there)")


def check_request(model: ModelInfo, request: GenerateRequest, labels: Mapping[str, str] | None = None) -> None:
    """Refuse, with one line naming the field (`labels` maps field → what the user typed), what the
    pipeline cannot run or would silently change; reads only small JSON configs."""
    names = {**PLAIN_LABELS, **(labels or {})}
    if request.steps is not None and request.steps < 1:
        raise ConfigError(f"{names['steps']} {request.steps}: must be at least 1")
    if not 0 <= request.seed <= SEED_MAX:
        raise ConfigError(f"{names['seed']} {request.seed}: must be between 0 and 2**64-1 ({SEED_MAX})")
    if request.guidance is not None and not math.isfinite(request.guidance):
        raise ConfigError(f"{names['guidance']} {request.guidance}: must be a finite number")
    rule = size_rule(model) if (request.height or 0) > 0 or (request.width or 0) > 0 else None
    _check_size(names["height"], request.height, rule and rule.height_multiple, rule and rule.max_height, rule)
    _check_size(names["width"], request.width, rule and rule.width_multiple, rule and rule.max_width, rule)
    check_binning(model, request, names)
