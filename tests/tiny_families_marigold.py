"""Tiny Marigold pipelines (depth, surface normals, intrinsics): an image in, a prediction map out, not a picture.

Configs follow diffusers' tests/pipelines/marigold/test_marigold_{depth,normals,intrinsics}.py
`get_dummy_components` (the tokenizer is the offline byte-level CLIP one), with a default processing resolution
of 32 so that a request needs no `--param`.
"""

from __future__ import annotations

from omni_console.engine.demo.demo_model import seeded
from omni_console.engine.demo.tokenizers_offline import build_clip_tokenizer


def make_marigold_pipeline(seed: int, kind: str = "depth"):
    from diffusers import (
        AutoencoderKL,
        LCMScheduler,
        MarigoldDepthPipeline,
        MarigoldIntrinsicsPipeline,
        MarigoldNormalsPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    out = 8 if kind == "intrinsics" else 4  # intrinsics: one latent (4 channels) per target, two targets
    with seeded(seed, 1):
        unet = UNet2DConditionModel(block_out_channels=(32, 64), layers_per_block=2, sample_size=32,
                                    in_channels=4 + out, out_channels=out,
                                    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32).eval()
    scheduler = LCMScheduler(beta_start=0.00085, beta_end=0.012, prediction_type="v_prediction", set_alpha_to_one=False,
                             steps_offset=1, beta_schedule="scaled_linear", clip_sample=False, thresholding=False)
    with seeded(seed, 2):
        vae = AutoencoderKL(block_out_channels=[32, 64], in_channels=3, out_channels=3,
                            down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                            latent_channels=4).eval()
    with seeded(seed, 3):
        text_encoder = CLIPTextModel(CLIPTextConfig(
            bos_token_id=0, eos_token_id=2, hidden_size=32, intermediate_size=37, layer_norm_eps=1e-05,
            num_attention_heads=4, num_hidden_layers=5, pad_token_id=1, vocab_size=49408)).eval()
    common = {"unet": unet, "scheduler": scheduler, "vae": vae, "text_encoder": text_encoder,
              "tokenizer": build_clip_tokenizer(), "default_denoising_steps": 1, "default_processing_resolution": 32}
    if kind == "depth":
        return MarigoldDepthPipeline(prediction_type="depth", scale_invariant=True, shift_invariant=True, **common)
    if kind == "normals":
        return MarigoldNormalsPipeline(prediction_type="normals", use_full_z_range=True, **common)
    return MarigoldIntrinsicsPipeline(prediction_type="intrinsics", target_properties=INTRINSICS_TARGETS, **common)


INTRINSICS_TARGETS = {
    "target_names": ["albedo", "material"],
    "albedo": {"prediction_space": "srgb"},
    "material": {"prediction_space": "stack", "sub_target_names": ["roughness", "metallicity", None]},
    "roughness": {"prediction_space": "linear", "up_to_scale": False},
    "metallicity": {"prediction_space": "linear", "up_to_scale": False},
}
"""Two targets as Marigold-IID-Appearance names them: albedo, and roughness and metallicity stacked in one."""
