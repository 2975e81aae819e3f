"""Tiny random-weight LTX-Video (text-to-video, image-to-video) and CogVideoX pipelines, in memory.

`tiny_families` turns them into model directories (`build_tiny_ltx`, `build_tiny_ltx_i2v`,
`build_tiny_cogvideox`). Each component is built under its own derived seed (`demo_model.seeded`), so a
build is deterministic per seed; sizes are chosen so a whole request takes about a second on a CPU.
"""

from __future__ import annotations

from typing import Any

from omni_console.engine.demo.demo_model import seeded, tiny_t5_config


def _ltx_components(seed: int) -> dict[str, Any]:
    """LTX-Video's parts: T5 encoder, video DiT with ``transformer_blocks``, causal video VAE with the
    real model's 8x temporal compression (spatial 8 here: patch size 1 instead of 4)."""
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXVideoTransformer3DModel
    from transformers import T5EncoderModel

    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    t5_tok = build_t5_tokenizer()
    t5_dim = 32
    with seeded(seed, 1):
        text_encoder = T5EncoderModel(tiny_t5_config(len(t5_tok), d_model=t5_dim)).eval()
    with seeded(seed, 2):
        transformer = LTXVideoTransformer3DModel(
            in_channels=8,
            out_channels=8,
            patch_size=1,
            patch_size_t=1,
            num_attention_heads=4,
            attention_head_dim=8,
            cross_attention_dim=32,
            num_layers=3,
            caption_channels=t5_dim,
        ).eval()
    with seeded(seed, 3):
        vae = AutoencoderKLLTXVideo(
            in_channels=3,
            out_channels=3,
            latent_channels=8,
            block_out_channels=(8, 8, 8, 8),
            decoder_block_out_channels=(8, 8, 8, 8),
            layers_per_block=(1, 1, 1, 1, 1),
            decoder_layers_per_block=(1, 1, 1, 1, 1),
            spatio_temporal_scaling=(True, True, True, False),
            decoder_spatio_temporal_scaling=(True, True, True, False),
            decoder_inject_noise=(False, False, False, False, False),
            upsample_residual=(False, False, False, False),
            upsample_factor=(1, 1, 1, 1),
            timestep_conditioning=False,
            patch_size=1,
            patch_size_t=1,
            encoder_causal=True,
            decoder_causal=False,
        ).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
        base_image_seq_len=1024, max_image_seq_len=4096,
    )
    return {"tokenizer": t5_tok, "text_encoder": text_encoder, "vae": vae, "transformer": transformer,
            "scheduler": scheduler}


def make_ltx_pipeline(seed: int):
    """LTX-Video text-to-video (LTXPipeline)."""
    from diffusers import LTXPipeline

    return LTXPipeline(**_ltx_components(seed))


def make_ltx_i2v_pipeline(seed: int):
    """LTX-Video image-to-video (LTXImageToVideoPipeline): the LTX parts, the first frame from an image."""
    from diffusers import LTXImageToVideoPipeline

    return LTXImageToVideoPipeline(**_ltx_components(seed))


def make_cogvideox_pipeline(seed: int):
    """CogVideoX (2b-style: sin-cos position embeddings over text + video, so the text length must equal the
    transformer's ``max_text_seq_length``, 16 here), T5 encoder, CogVideoX VAE (4x temporal)."""
    from diffusers import (
        AutoencoderKLCogVideoX,
        CogVideoXDDIMScheduler,
        CogVideoXPipeline,
        CogVideoXTransformer3DModel,
    )
    from transformers import T5EncoderModel

    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    t5_tok = build_t5_tokenizer()
    t5_dim = 32
    with seeded(seed, 1):
        text_encoder = T5EncoderModel(tiny_t5_config(len(t5_tok), d_model=t5_dim)).eval()
    with seeded(seed, 2):
        transformer = CogVideoXTransformer3DModel(
            num_attention_heads=4,
            attention_head_dim=8,
            in_channels=4,
            out_channels=4,
            time_embed_dim=2,
            text_embed_dim=t5_dim,
            num_layers=3,
            sample_width=4,
            sample_height=4,
            sample_frames=9,
            patch_size=2,
            temporal_compression_ratio=4,
            max_text_seq_length=16,
        ).eval()
    with seeded(seed, 3):
        vae = AutoencoderKLCogVideoX(
            in_channels=3,
            out_channels=3,
            down_block_types=("CogVideoXDownBlock3D",) * 4,
            up_block_types=("CogVideoXUpBlock3D",) * 4,
            block_out_channels=(8, 8, 8, 8),
            latent_channels=4,
            layers_per_block=1,
            norm_num_groups=2,
            temporal_compression_ratio=4,
        ).eval()
    scheduler = CogVideoXDDIMScheduler(
        num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
        clip_sample=False, prediction_type="v_prediction", rescale_betas_zero_snr=True, snr_shift_scale=3.0,
        timestep_spacing="trailing",
    )
    return CogVideoXPipeline(
        tokenizer=t5_tok, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler
    )
