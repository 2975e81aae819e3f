"""A tiny Qwen-Image-Layered pipeline: an image split into RGBA layers, each a still of its own.

Configs follow diffusers' tests/pipelines/qwenimage/test_qwenimage_layered.py `get_dummy_components` (a 3-channel
VAE: at this size a 4-channel one, as the released model's RGBA VAE, fails in plain diffusers too), with the
released transformer's layer-3D RoPE and extra timestep condition, and two blocks so it streams. The byte-level
Qwen2-VL tokenizer stands in for the processor, as in `tiny_families_qwen`: with a prompt given, the pipeline never
calls its processor.
"""

from __future__ import annotations

from tiny_families_new import _byte_qwen_tokenizer
from tiny_families_qwen import QWEN_VL_TEMPLATE, _mrope

from omni_console.engine.demo.demo_model import seeded


def make_qwen_image_layered_pipeline(seed: int, channels: int = 3):
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImageLayeredPipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = _byte_qwen_tokenizer()
    tok.chat_template = QWEN_VL_TEMPLATE
    n = len(tok)
    with seeded(seed, 1):
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=3,
            joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4),
            use_additional_t_cond=True, use_layer3d_rope=True).eval()  # as the released model
    with seeded(seed, 2):
        vae = AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                     temperal_downsample=[False, True], latents_mean=[0.0] * 4,
                                     latents_std=[1.0] * 4, input_channels=channels).eval()
    with seeded(seed, 3):
        text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
            text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                         "num_key_value_heads": 2, "rope_theta": 1000000.0, "vocab_size": n, "bos_token_id": n - 3,
                         "eos_token_id": n - 1, "rope_scaling": _mrope([1, 1, 2])},
            vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                           "out_hidden_size": 16},
            hidden_size=16, vocab_size=n, vision_start_token_id=n, vision_end_token_id=n + 1,
            vision_token_id=n + 2)).eval()
    processor = _byte_qwen_tokenizer()
    processor.chat_template = QWEN_VL_TEMPLATE
    return QwenImageLayeredPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                                    tokenizer=tok, processor=processor, transformer=transformer)


LAYERED_GENERATION = {"num_inference_steps": 2, "layers": 2, "max_sequence_length": 16, "resolution": 640}
"""diffusers' test's call (the image and prompt aside): two layers at the 640 bucket."""
