"""A tiny Stable Video Diffusion pipeline (image to video, a spatio-temporal UNet).

Configs follow diffusers' tests/pipelines/stable_video_diffusion/test_stable_video_diffusion.py
`get_dummy_components`, but for the CLIP vision encoder: the pipeline resizes its conditioning image to 224², so the
encoder takes 224² in 14-pixel patches (at the test's 32² the plain pipeline fails in the encoder's embeddings).
"""

from __future__ import annotations

from omni_console.engine.demo.demo_model import seeded


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
