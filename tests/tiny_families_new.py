"""Tiny pipelines of families plain diffusers runs that the engine refused (issue "Trust 3", part A4):
PixArt-Sigma as diffusers' own fast test builds it (transformer `sample_size` 8, no binning table), PRX
(a `T5GemmaEncoder`), HunyuanVideo 1.5 (a config-only `guider`) and LTX-2 (classes from its own pipeline
package; video and audio).

Configs follow diffusers' tests/pipelines/<family>/test_*.py `get_dummy_components`; tokenizers that the
tests download are built offline (`tokenizers_offline`). Same conventions as `tiny_families_more`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiny_families_loading import _t5

from omni_console.engine.demo.demo_model import atomic_build, save_pipeline, seeded

NEW_GENERATION: dict[str, dict[str, Any]] = {
    # diffusers' test passes use_resolution_binning=False; the engine must pick that itself (no table for 8)
    "pixart_sigma_8": {"height": 8, "width": 8, "num_inference_steps": 2, "max_sequence_length": 16},
}
"""Small call kwargs per family (what the CLI can pass: no hidden extras)."""
PLAIN_EXTRA: dict[str, dict[str, Any]] = {"pixart_sigma_8": {"use_resolution_binning": False}}
"""What diffusers' own tests pass by hand to plain diffusers, and the engine must choose itself."""


def make_pixart_sigma_8_pipeline(seed: int):
    """PixArt-Sigma as diffusers' fast test builds it: a 2-block DiT of sample_size 8, the default
    `AutoencoderKL()`, DDIM."""
    from diffusers import AutoencoderKL, DDIMScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    tok, encoder = _t5(seed, 1)
    with seeded(seed, 2):
        transformer = PixArtTransformer2DModel(
            sample_size=8, num_layers=2, patch_size=2, attention_head_dim=8, num_attention_heads=3,
            caption_channels=32, in_channels=4, cross_attention_dim=24, out_channels=8, attention_bias=True,
            activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
            norm_elementwise_affine=False, norm_eps=1e-6).eval()
    with seeded(seed, 3):
        vae = AutoencoderKL().eval()
    return PixArtSigmaPipeline(tokenizer=tok, text_encoder=encoder, vae=vae, transformer=transformer,
                               scheduler=DDIMScheduler())


MAKERS: dict[str, tuple[Callable[[int], Any], dict[str, str]]] = {
    "pixart_sigma_8": (make_pixart_sigma_8_pipeline, {"tokenizer": "T5TokenizerFast"}),
}


def build_tiny_new_family(family: str, path: Path, seed: int = 0) -> Path:
    """Write family `family` of `MAKERS` to `path` (atomically; an identical earlier build is kept)."""
    make, layout = MAKERS[family]

    def build(tmp: Path) -> None:
        save_pipeline(make(seed), tmp, class_names=layout)

    return atomic_build(Path(path), build, {"family": family, "seed": seed})
