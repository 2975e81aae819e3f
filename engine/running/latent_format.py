"""Which latent→RGB table fits a loaded pipeline: decided by its VAE (the latent space is the VAE's),
its latent channels and, where one VAE class serves several spaces, its scaling/shift factors.

Read from the loaded pipeline's objects (their configs were parsed by diffusers from the model
directory, which is untrusted: a value is only compared, never executed or used as a path). A VAE
whose channels do not match the table's rows gets no table: a preview from the wrong space would
mislead, so it says "no preview" instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .latent_rgb_table import LATENT_RGB


@dataclass(frozen=True, slots=True)
class LatentFormat:
    """A table that fits: its name, factors (one (R, G, B) row per channel) and bias."""

    name: str
    factors: tuple[tuple[float, float, float], ...]
    bias: tuple[float, float, float]

    @property
    def channels(self) -> int:
        return len(self.factors)


# (VAE class, latent channels, scaling factor or None for any, shift factor or None for any) -> format.
# First match wins; AutoencoderKL serves SD 1.x, SDXL, SD3 and Flux, told apart by their published factors.
VAE_RULES: tuple[tuple[str, int, float | None, float | None, str], ...] = (
    ("AutoencoderKL", 16, None, 0.1159, "flux"),
    ("AutoencoderKL", 16, None, 0.0609, "sd3"),
    ("AutoencoderKL", 4, 0.13025, None, "sdxl"),
    ("AutoencoderKL", 4, None, None, "sd15"),
    ("AutoencoderKLWan", 16, None, None, "wan21"),
    ("AutoencoderKLWan", 48, None, None, "wan22"),
    ("AutoencoderKLQwenImage", 16, None, None, "wan21"),
    ("AutoencoderKLMochi", 12, None, None, "mochi"),
    ("AutoencoderKLLTXVideo", 128, None, None, "ltx_video"),
    ("AutoencoderKLHunyuanVideo", 16, None, None, "hunyuan_video"),
    ("AutoencoderKLHunyuanImage", 64, None, None, "hunyuan_image21"),
)
SDXL_PIPELINE_PREFIX = "StableDiffusionXL"
"""An SDXL pipeline whose VAE config lacks SDXL's scaling factor is still in SDXL's latent space."""


def vae_channels(vae: Any) -> int | None:
    """The VAE's latent channels from its config (`latent_channels`, or `z_dim` for the Wan-style VAEs)."""
    config = getattr(vae, "config", None)
    for key in ("latent_channels", "z_dim"):
        value = getattr(config, key, None) if config is not None else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _close(value: Any, expected: float | None) -> bool:
    if expected is None:
        return True
    return isinstance(value, (int, float)) and abs(float(value) - expected) < 1e-3


def latent_format_of(pipe: Any) -> LatentFormat | None:
    """The table for this pipeline's latents, or None (no VAE, an unknown VAE, channels that do not match)."""
    vae = getattr(pipe, "vae", None)
    if vae is None:
        return None
    vae_class, channels = type(vae).__name__, vae_channels(vae)
    config = getattr(vae, "config", None)
    scaling, shift = getattr(config, "scaling_factor", None), getattr(config, "shift_factor", None)
    for rule_class, rule_channels, rule_scaling, rule_shift, name in VAE_RULES:
        if vae_class != rule_class or channels != rule_channels:
            continue
        if name == "sd15" and type(pipe).__name__.startswith(SDXL_PIPELINE_PREFIX):
            name = "sdxl"
        elif not (_close(scaling, rule_scaling) and _close(shift, rule_shift)):
            continue
        factors, bias = LATENT_RGB[name]
        return LatentFormat(name, factors, bias)
    return None


def no_preview_reason(pipe: Any) -> str:
    """What the operator reads when a pipeline has no table."""
    vae = getattr(pipe, "vae", None)
    if vae is None:
        return f"no preview: {type(pipe).__name__} has no VAE"
    return (f"no preview: no latent→RGB factors for {type(vae).__name__} with "
            f"{vae_channels(vae) or '?'} latent channels ({type(pipe).__name__})")
