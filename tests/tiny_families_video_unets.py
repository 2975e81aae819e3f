"""Tiny video pipelines whose denoiser is a UNet of its own kind: Stable Video Diffusion (image to video, a
spatio-temporal UNet) and AnimateDiff (text to video, SD1.5's UNet with a motion module after each layer).

Configs follow diffusers' own fast tests (`get_dummy_components` in tests/pipelines/stable_video_diffusion and
tests/pipelines/animatediff), with two changes: SVD's CLIP vision encoder takes 224² in 14-pixel patches (the
pipeline resizes its conditioning image to 224², so at the test's 32² the plain pipeline fails in the encoder's
embeddings), and AnimateDiff's tokenizer is the offline CLIP one. AnimateDiff's pipeline merges the motion adapter
into a `UNetMotionModel` when built, and `save_pretrained` writes that UNet.
"""

from __future__ import annotations

from omni_console.engine.demo.demo_model import seeded, tiny_clip_text_config, tiny_vae


def make_svd_pipeline(seed: int):
    from diffusers import (
        AutoencoderKLTemporalDecoder,
        EulerDiscreteScheduler,
        StableVideoDiffusionPipeline,
        UNetSpatioTemporalConditionModel,
    )
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    with seeded(seed, 1):
        unet = UNetSpatioTemporalConditionModel(
            block_out_channels=(32, 64), layers_per_block=2, sample_size=32, in_channels=8, out_channels=4,
            down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
            up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"), cross_attention_dim=32,
            num_attention_heads=8, projection_class_embeddings_input_dim=96, addition_time_embed_dim=32).eval()
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", interpolation_type="linear",
        num_train_timesteps=1000, prediction_type="v_prediction", sigma_max=700.0, sigma_min=0.002, steps_offset=1,
        timestep_spacing="leading", timestep_type="continuous", use_karras_sigmas=True)
    with seeded(seed, 2):
        vae = AutoencoderKLTemporalDecoder(block_out_channels=[32, 64], in_channels=3, out_channels=3,
                                           down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
                                           latent_channels=4).eval()
    with seeded(seed, 3):
        image_encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(
            hidden_size=32, projection_dim=32, num_hidden_layers=5, num_attention_heads=4, image_size=224,
            intermediate_size=37, patch_size=14)).eval()
    return StableVideoDiffusionPipeline(vae=vae, image_encoder=image_encoder, unet=unet, scheduler=scheduler,
                                        feature_extractor=CLIPImageProcessor(crop_size=32, size=32))


def make_animatediff_pipeline(seed: int):
    from diffusers import AnimateDiffPipeline, DDIMScheduler, MotionAdapter, UNet2DConditionModel
    from transformers import CLIPTextModel

    from omni_console.engine.demo.tokenizers_offline import build_clip_tokenizer

    tokenizer = build_clip_tokenizer()
    with seeded(seed, 1):
        text_encoder = CLIPTextModel(tiny_clip_text_config(len(tokenizer), hidden=8)).eval()
    with seeded(seed, 2):
        unet = UNet2DConditionModel(
            block_out_channels=(8, 8), layers_per_block=2, sample_size=8, in_channels=4, out_channels=4,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=8, norm_num_groups=2).eval()
    with seeded(seed, 3):
        vae = tiny_vae(latent_channels=4, scaling_factor=0.18215, shift_factor=None)
    with seeded(seed, 4):
        adapter = MotionAdapter(block_out_channels=(8, 8), motion_layers_per_block=2, motion_norm_num_groups=2,
                                motion_num_attention_heads=4).eval()
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="linear", clip_sample=False)
    return AnimateDiffPipeline(unet=unet, scheduler=scheduler, vae=vae, motion_adapter=adapter,
                               text_encoder=text_encoder, tokenizer=tokenizer, feature_extractor=None,
                               image_encoder=None)
