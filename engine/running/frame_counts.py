"""The frame counts each video family renders exactly, so that a count the pipeline would change is
refused before load with the nearest ones it takes.

diffusers rounds a count it cannot take (Wan) or renders another one without a word (LTX, CogVideoX, Mochi,
HunyuanVideo); the rules come from each VAE's config the way its pipeline reads it (the tests render every
count of a range with plain diffusers and compare).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..model_dir.discovery import ModelInfo
from ..model_dir.weights import load_json
from .text_length import dit_config

MOCHI_TEMPORAL = 6  # MochiPipeline.vae_temporal_scale_factor, set in its __init__, not read from a config


@dataclass(frozen=True, slots=True)
class FramesRule:
    """Frame counts a video pipeline renders exactly: `1 + step * k` for k ≥ 0, and with `multiples`
    also `step * k` for k ≥ 1."""

    pipeline: str
    step: int
    why: str  # what the step comes from, for the refusal line
    multiples: bool = False

    @property
    def pattern(self) -> str:
        return f"{self.step}k or {self.step}k+1" if self.multiples else f"{self.step}k+1"

    def accepts(self, frames: int) -> bool:
        return frames >= 1 and ((frames - 1) % self.step == 0 or (self.multiples and frames % self.step == 0))

    def nearest(self, frames: int) -> tuple[int, ...]:
        """The counts it renders next to `frames`: the largest below (if any) and the smallest above."""
        below = next((n for n in range(frames - 1, max(frames - self.step - 1, 0), -1) if self.accepts(n)), None)
        above = next(n for n in range(frames + 1, frames + self.step + 2) if self.accepts(n))
        return (below, above) if below is not None else (above,)


def _vae_config(model: ModelInfo) -> dict[str, Any]:
    vaes = [c for c in model.components if c.name == "vae"] or model.by_role("vae")
    path = vaes[0].folder / "config.json" if vaes else None
    return load_json(path) if path is not None and path.is_file() else {}


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def frames_rule(model: ModelInfo) -> FramesRule | None:
    """The frame counts the pipeline renders as asked, from its VAE config the way the pipeline reads it
    (None: any count ≥ 1, or a family whose rule is not known here)."""
    name = model.pipeline_class
    config = _vae_config(model)
    if name.startswith("Wan"):  # rounds (num_frames - 1) to a multiple of scale_factor_temporal, with a warning
        step = _int(config.get("scale_factor_temporal"), 4)
        return FramesRule(name, step, f"its VAE's temporal factor is {step}")
    if name.startswith("LTX") and not name.startswith("LTX2"):
        # latent frames = (n - 1) // ratio + 1, decoded back to (latent - 1) * ratio + 1
        scaling = config.get("spatio_temporal_scaling", (True, True, True, False))
        computed = _int(config.get("patch_size_t"), 1) * 2 ** sum(bool(s) for s in scaling)
        step = _int(config.get("temporal_compression_ratio"), computed)
        return FramesRule(name, step, f"its VAE's temporal compression is {step}")
    if name.startswith("CogVideoX"):
        # latent frames L = (n - 1) // ratio + 1; the VAE decodes them in pairs of latent frames, each pair
        # to 2 * ratio frames, a pair with a third (the odd first one) to 2 * ratio + 1: an even L comes back
        # as ratio * L frames, an odd L as ratio * (L - 1) + 1 (measured against diffusers 0.42 in the tests)
        ratio = _int(config.get("temporal_compression_ratio"), 4)
        return FramesRule(name, 2 * ratio, f"its VAE's temporal compression is {ratio}, decoded in pairs",
                          multiples=True)
    if name.startswith("SanaVideo"):  # latent frames (n - 1) // factor + 1, the factor from a Wan/DC-AE VAE's config
        step = _int(config.get("scale_factor_temporal") or config.get("temporal_compression_ratio"), 4)
        return FramesRule(name, step, f"its VAE's temporal factor is {step}")
    if name.startswith("Mochi"):
        # the pipeline's own fixed factor (`vae_temporal_scale_factor = 6`, whatever the VAE config says):
        # latent frames (n - 1) // 6 + 1, decoded to 6 * (latent - 1) + 1 frames
        return FramesRule(name, MOCHI_TEMPORAL, f"its temporal factor is {MOCHI_TEMPORAL}")
    if name.startswith("HunyuanVideo") and "Framepack" not in name:  # Framepack renders in sections: no rule
        step = _int(config.get("temporal_compression_ratio"), 4)
        return FramesRule(name, step, f"its VAE's temporal compression is {step}")
    return None


def fixed_frame_counts(model: ModelInfo) -> tuple[int, ...] | None:
    """The only frame counts a pipeline renders at all, where they are so few (None: see `frames_rule`).

    Latte adds its transformer's temporal position table (`video_length` rows, 16 in the released model)
    to every multi-frame latent: any other count than 1 or `video_length` fails in the first DiT forward."""
    if not model.pipeline_class.startswith("Latte"):
        return None
    length = _int(dit_config(model).get("video_length"), 16)
    return (1, length) if length > 1 else (1,)


def check_frames(model: ModelInfo, frames: int, label: str) -> None:
    if frames < 1:
        raise ConfigError(f"{label} {frames}: must be at least 1")
    counts = fixed_frame_counts(model)
    if counts is not None:
        if frames not in counts:
            raise ConfigError(f"{label} {frames}: {model.pipeline_class} renders {' or '.join(map(str, counts))} "
                              f"frames (its transformer's temporal position table holds video_length = "
                              f"{counts[-1]} frames)")
        return
    rule = frames_rule(model)
    if rule is not None and not rule.accepts(frames):
        examples = " or ".join(map(str, rule.nearest(frames)))
        raise ConfigError(f"{label} {frames}: {rule.pipeline} renders {rule.pattern} frames ({rule.why}); "
                          f"e.g. {examples}")
