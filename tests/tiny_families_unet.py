"""Tiny random-weight UNet pipelines (SD1.5 and SDXL), built offline, saved with `save_pretrained`.

Configs follow diffusers' own fast tests (`tests/pipelines/stable_diffusion*`), with block types laid out
as in the real checkpoints (SD1.5: cross-attention down blocks first, a plain one last; SDXL: a plain
down block first, then cross-attention ones with more transformer layers), so the UNet's blocks differ
in size as they do at full scale. Each component is built under its own derived seed
(`demo_model.seeded`): a build is deterministic per seed.

SD1.5 is saved without a safety checker (`safety_checker=None, requires_safety_checker=False`, as
diffusers' tests build it): `model_index.json` then names `safety_checker` and `feature_extractor` as
`[null, null]` and keeps `requires_safety_checker: false`, which the loader passes on as diffusers does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_console.engine.demo.build_dir import atomic_build
from omni_console.engine.demo.demo_model import seeded, tiny_clip_text_config, tiny_vae

__all__ = ["UNET_GENERATION", "build_tiny_sd15", "build_tiny_sdxl", "make_sd15_pipeline", "make_sdxl_pipeline"]

UNET_GENERATION: dict[str, dict[str, Any]] = {
    "sd15": {"height": 64, "width": 64, "num_inference_steps": 2},
    "sdxl": {"height": 64, "width": 64, "num_inference_steps": 2},
}
"""Small, fast call kwargs per family."""


def make_sd15_pipeline(seed: int):
    """SD1.5: one CLIP text encoder, a UNet with 2 down blocks (cross-attention, plain), a mid block and
    2 up blocks (plain, cross-attention), a 4-channel VAE, PNDM as in the hub's scheduler config."""
    from diffusers import PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    from omni_console.engine.demo.tokenizers_offline import build_clip_tokenizer

    tokenizer = build_clip_tokenizer()
    with seeded(seed, 1):
        text_encoder = CLIPTextModel(tiny_clip_text_config(len(tokenizer), hidden=32)).eval()
    with seeded(seed, 2):
        unet = UNet2DConditionModel(
            block_out_channels=(32, 64),
            layers_per_block=2,
            sample_size=8,
            in_channels=4,
            out_channels=4,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=32,
            attention_head_dim=8,
            norm_num_groups=8,
        ).eval()
    with seeded(seed, 3):
        vae = tiny_vae(latent_channels=4, scaling_factor=0.18215, shift_factor=None)
    scheduler = PNDMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                              skip_prk_steps=True, set_alpha_to_one=False, steps_offset=1)
    return StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                   scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)


def make_sdxl_pipeline(seed: int):
    """SDXL: CLIP + CLIP-with-projection, a UNet with `text_time` added conditioning, a plain down block
    then a cross-attention one with 2 transformer layers (the up blocks mirror them), Euler discrete."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    from omni_console.engine.demo.tokenizers_offline import build_clip_tokenizer

    tokenizer, tokenizer_2 = build_clip_tokenizer(), build_clip_tokenizer()
    with seeded(seed, 1):
        text_encoder = CLIPTextModel(tiny_clip_text_config(len(tokenizer), hidden=32)).eval()
    with seeded(seed, 2):
        text_encoder_2 = CLIPTextModelWithProjection(
            tiny_clip_text_config(len(tokenizer_2), hidden=32, projection=32)).eval()
    with seeded(seed, 3):
        unet = UNet2DConditionModel(
            block_out_channels=(32, 64),
            layers_per_block=2,
            sample_size=8,
            in_channels=4,
            out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=(2, 4),
            use_linear_projection=True,
            addition_embed_type="text_time",
            addition_time_embed_dim=8,
            transformer_layers_per_block=(1, 2),
            projection_class_embeddings_input_dim=80,  # 6 time ids x 8 + the pooled text (32)
            cross_attention_dim=64,  # both encoders' hidden states side by side
            norm_num_groups=8,
        ).eval()
    with seeded(seed, 4):
        vae = tiny_vae(latent_channels=4, scaling_factor=0.13025, shift_factor=None)
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       steps_offset=1, timestep_spacing="leading")
    return StableDiffusionXLPipeline(vae=vae, text_encoder=text_encoder, text_encoder_2=text_encoder_2,
                                     tokenizer=tokenizer, tokenizer_2=tokenizer_2, unet=unet, scheduler=scheduler)


def _build(path: Path, family: str, seed: int, make: Any) -> Path:
    def build(tmp: Path) -> None:
        make(seed).save_pretrained(str(tmp), safe_serialization=True)

    return atomic_build(Path(path), build, {"family": family, "seed": seed})


def build_tiny_sd15(path: Path, seed: int = 0) -> Path:
    """A tiny StableDiffusionPipeline without a safety checker at ``path``."""
    return _build(path, "sd15", seed, make_sd15_pipeline)


def build_tiny_sdxl(path: Path, seed: int = 0) -> Path:
    """A tiny StableDiffusionXLPipeline at ``path``."""
    return _build(path, "sdxl", seed, make_sdxl_pipeline)
