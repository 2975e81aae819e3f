"""Tiny pipelines of families whose text encoder is a Qwen model: Z-Image, Ovis-Image, LongCat-Image, FLUX.2
klein, HunyuanImage 2.1, Krea 2, NucleusMoE-Image, EasyAnimate, Kandinsky 5 text-to-video and DreamLite (a UNet).

Configs follow diffusers' tests/pipelines/<family>/test_*.py `get_dummy_components` (LongCat-Image, which has no
pipeline test, its transformer model test), with every block list at least two blocks long so it streams.
Tokenizers are byte-level Qwen2 ones built offline. Where diffusers' test downloads a Qwen-VL *processor*
(Kandinsky 5, NucleusMoE-Image, LongCat-Image's `text_processor`), a byte-level tokenizer with a chat template
stands in: transformers builds those processors only with torchvision, and these pipelines call no more than
`apply_chat_template`, `__call__(text=...)` and `batch_decode` on them for a text prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tiny_families_new import _byte_qwen_tokenizer

from omni_console.engine.demo.demo_model import seeded
from omni_console.engine.demo.tokenizers_offline import build_clip_tokenizer

QWEN_VL_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% elif c['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{% endif %}{% endfor %}"
    "{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}")
"""Qwen2-VL's chat template: message contents as a string or as a list of typed parts."""
_VL_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                "<|image_pad|>", "<|video_pad|>")


def byte_qwen_vl_tokenizer():
    """A byte-level Qwen2 tokenizer with Qwen2-VL's special tokens and chat template (built offline)."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import Qwen2Tokenizer

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    for special in _VL_SPECIALS:
        vocab[special] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": list(_VL_SPECIALS[1:])})
    tok.chat_template = QWEN_VL_TEMPLATE
    return tok


def _mrope(section: list[int]) -> dict:
    return {"mrope_section": section, "rope_type": "default", "type": "default"}


def _zimage_vae(seed: int, index: int):
    from diffusers import AutoencoderKL

    with seeded(seed, index):
        return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2,
                             up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=[32, 64], layers_per_block=1,
                             latent_channels=16, norm_num_groups=32, sample_size=32, scaling_factor=0.3611,
                             shift_factor=0.1159).eval()


def _qwen_image_vae(seed: int, index: int):
    from diffusers import AutoencoderKLQwenImage

    with seeded(seed, index):
        return AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                      temperal_downsample=[False, True], latents_mean=[0.0] * 4,
                                      latents_std=[1.0] * 4).eval()


def _flux2_vae(seed: int, index: int):
    from diffusers import AutoencoderKLFlux2

    with seeded(seed, index):
        return AutoencoderKLFlux2(sample_size=32, in_channels=3, out_channels=3,
                                  down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",),
                                  block_out_channels=(4,), layers_per_block=1,
                                  latent_channels=1, norm_num_groups=1, use_quant_conv=False,
                                  use_post_quant_conv=False).eval()


def make_z_image_pipeline(seed: int):
    """Z-Image: a Qwen3 encoder, a single-stream DiT with `noise_refiner`, `context_refiner` and `layers`."""
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    with seeded(seed, 1):
        transformer = ZImageTransformer2DModel(
            all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2, n_refiner_layers=2,
            n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True, cap_feat_dim=16, rope_theta=256.0, t_scale=1000.0,
            axes_dims=[8, 4, 4], axes_lens=[256, 32, 32]).eval()
        with torch.no_grad():  # as diffusers' test sets them (random pads would be NaN-prone)
            transformer.x_pad_token.copy_(torch.ones_like(transformer.x_pad_token))
            transformer.cap_pad_token.copy_(torch.ones_like(transformer.cap_pad_token))
    tok = _byte_qwen_tokenizer()
    with seeded(seed, 3):
        text_encoder = Qwen3Model(Qwen3Config(hidden_size=16, intermediate_size=16, num_hidden_layers=2,
                                              num_attention_heads=2, num_key_value_heads=2, vocab_size=len(tok),
                                              max_position_embeddings=512)).eval()
    return ZImagePipeline(transformer=transformer, vae=_zimage_vae(seed, 2),
                          scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=text_encoder, tokenizer=tok)


def make_ovis_image_pipeline(seed: int):
    """Ovis-Image: a Qwen3 encoder, a Flux-like DiT with `transformer_blocks` and `single_transformer_blocks`."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, OvisImagePipeline, OvisImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    with seeded(seed, 1):
        transformer = OvisImageTransformer2DModel(
            patch_size=1, in_channels=4, out_channels=4, num_layers=2, num_single_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 4, 8)).eval()
    with seeded(seed, 2):
        vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1,
                            latent_channels=1, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                            shift_factor=0.0609, scaling_factor=1.5035).eval()
    tok = _byte_qwen_tokenizer()
    with seeded(seed, 3):
        text_encoder = Qwen3Model(Qwen3Config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, vocab_size=len(tok), max_position_embeddings=512)).eval()
    return OvisImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                             tokenizer=tok, transformer=transformer)


def make_longcat_image_pipeline(seed: int):
    """LongCat-Image: a Qwen2.5-VL encoder (which also rewrites the prompt by default), a Flux-like DiT."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LongCatImagePipeline, LongCatImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = _byte_qwen_tokenizer()
    tok.chat_template = QWEN_VL_TEMPLATE
    n = len(tok)
    with seeded(seed, 1):
        text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
            text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                         "num_key_value_heads": 2, "rope_theta": 1000000.0, "vocab_size": n, "bos_token_id": n - 3,
                         "eos_token_id": n - 1, "rope_scaling": _mrope([1, 1, 2])},
            vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                           "out_hidden_size": 16},
            hidden_size=16, vocab_size=n, vision_start_token_id=n, vision_end_token_id=n + 1,
            vision_token_id=n + 2)).eval()
    with seeded(seed, 2):  # in_channels 64: the pipeline packs 16 latent channels 2x2
        transformer = LongCatImageTransformer2DModel(
            patch_size=1, in_channels=64, num_layers=2, num_single_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=16, axes_dims_rope=[4, 4, 8]).eval()
    processor = _byte_qwen_tokenizer()
    processor.chat_template = QWEN_VL_TEMPLATE
    return LongCatImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=_zimage_vae(seed, 3),
                                text_encoder=text_encoder, tokenizer=tok, text_processor=processor,
                                transformer=transformer)


def make_flux2_klein_pipeline(seed: int):
    """FLUX.2 klein: a Qwen3 causal LM whose chosen hidden layers feed the FLUX.2 DiT."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with seeded(seed, 1):
        transformer = Flux2Transformer2DModel(
            patch_size=1, in_channels=4, num_layers=2, num_single_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=48, timestep_guidance_channels=256,
            axes_dims_rope=[4, 4, 4, 4], guidance_embeds=False).eval()
    tok = _byte_qwen_tokenizer()
    with seeded(seed, 2):
        text_encoder = Qwen3ForCausalLM(Qwen3Config(
            intermediate_size=16, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
            vocab_size=len(tok), max_position_embeddings=512)).eval()
    return Flux2KleinPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=_flux2_vae(seed, 3),
                              text_encoder=text_encoder, tokenizer=tok, transformer=transformer)


def make_hunyuan_image_21_pipeline(seed: int):
    """HunyuanImage 2.1: a Qwen2.5-VL encoder and a ByT5 glyph encoder, two adaptive-projected guiders."""
    from diffusers import (
        AdaptiveProjectedMixGuidance,
        AutoencoderKLHunyuanImage,
        FlowMatchEulerDiscreteScheduler,
        HunyuanImagePipeline,
        HunyuanImageTransformer2DModel,
    )
    from transformers import (
        ByT5Tokenizer,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        T5Config,
        T5EncoderModel,
    )

    with seeded(seed, 1):
        transformer = HunyuanImageTransformer2DModel(
            in_channels=4, out_channels=4, num_attention_heads=4, attention_head_dim=8, num_layers=2,
            num_single_layers=2, num_refiner_layers=2, patch_size=(1, 1), guidance_embeds=False, text_embed_dim=32,
            text_embed_2_dim=32, rope_axes_dim=(4, 4)).eval()
    with seeded(seed, 2):
        vae = AutoencoderKLHunyuanImage(in_channels=3, out_channels=3, latent_channels=4,
                                        block_out_channels=(32, 64, 64, 64), layers_per_block=1,
                                        scaling_factor=0.476986, spatial_compression_ratio=8, sample_size=128).eval()
    tok = _byte_qwen_tokenizer()
    n = len(tok)
    with seeded(seed, 3):
        text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
            text_config={"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
                         "num_key_value_heads": 2, "vocab_size": n + 3, "rope_scaling": _mrope([2, 2, 4]),
                         "rope_theta": 1000000.0},
            vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2,
                           "out_hidden_size": 32},
            hidden_size=32, vocab_size=n + 3, vision_start_token_id=n, vision_end_token_id=n + 1,
            vision_token_id=n + 2)).eval()
    tok_2 = ByT5Tokenizer()
    with seeded(seed, 4):
        text_encoder_2 = T5EncoderModel(T5Config(
            d_model=32, d_kv=4, d_ff=16, num_layers=2, num_heads=2, relative_attention_num_buckets=8,
            relative_attention_max_distance=32, vocab_size=len(tok_2), feed_forward_proj="gated-gelu",
            dense_act_fn="gelu_new", is_encoder_decoder=False, use_cache=False, tie_word_embeddings=False)).eval()
    return HunyuanImagePipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=text_encoder, text_encoder_2=text_encoder_2, tokenizer=tok, tokenizer_2=tok_2,
        guider=AdaptiveProjectedMixGuidance(adaptive_projected_guidance_start_step=2),
        ocr_guider=AdaptiveProjectedMixGuidance(adaptive_projected_guidance_start_step=3))


def make_krea2_pipeline(seed: int):
    """Krea 2: a Qwen3-VL encoder whose selected layers feed the DiT's own text blocks."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Krea2Pipeline, Krea2Transformer2DModel
    from transformers import Qwen3VLConfig, Qwen3VLModel

    with seeded(seed, 1):
        transformer = Krea2Transformer2DModel(
            in_channels=16, num_layers=2, attention_head_dim=8, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=32, timestep_embed_dim=8, text_hidden_dim=16, num_text_layers=3,
            text_num_attention_heads=2, text_num_key_value_heads=1, text_intermediate_size=16,
            num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(4, 2, 2), rope_theta=1000.0).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=6400)
    with seeded(seed, 3):
        text_encoder = Qwen3VLModel(Qwen3VLConfig(
            text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                         "num_key_value_heads": 2, "head_dim": 8},
            vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                           "out_hidden_size": 16},
            vocab_size=152064)).eval()
    return Krea2Pipeline(transformer=transformer, vae=_qwen_image_vae(seed, 2), scheduler=scheduler,
                         text_encoder=text_encoder, tokenizer=byte_qwen_vl_tokenizer(),
                         text_encoder_select_layers=(0, 1, 2))


def make_nucleusmoe_image_pipeline(seed: int):
    """NucleusMoE-Image: a Qwen3-VL encoder (a tokenizer as its `processor`), a QwenImage-like DiT."""
    from diffusers import FlowMatchEulerDiscreteScheduler, NucleusMoEImagePipeline, NucleusMoEImageTransformer2DModel
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    with seeded(seed, 1):
        transformer = NucleusMoEImageTransformer2DModel(
            patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=4,
            joint_attention_dim=16, axes_dims_rope=(8, 4, 4), moe_enabled=False, capacity_factors=[8.0, 8.0]).eval()
    with seeded(seed, 3):
        text_encoder = Qwen3VLForConditionalGeneration(Qwen3VLConfig(
            text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 8, "num_attention_heads": 2,
                         "num_key_value_heads": 2, "rope_scaling": _mrope([1, 1, 2]), "rope_theta": 1000000.0,
                         "vocab_size": 151936, "head_dim": 8},
            vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                           "out_channels": 16})).eval()
    return NucleusMoEImagePipeline(transformer=transformer, vae=_qwen_image_vae(seed, 2),
                                   scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=text_encoder,
                                   processor=byte_qwen_vl_tokenizer())


def make_easyanimate_pipeline(seed: int):
    """EasyAnimate: a Qwen2-VL encoder, a video DiT with `transformer_blocks`, the Magvit VAE."""
    from diffusers import (
        AutoencoderKLMagvit,
        EasyAnimatePipeline,
        EasyAnimateTransformer3DModel,
        FlowMatchEulerDiscreteScheduler,
    )
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tok = byte_qwen_vl_tokenizer()
    n = len(tok)
    with seeded(seed, 1):
        transformer = EasyAnimateTransformer3DModel(
            num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=2,
            text_embed_dim=16, num_layers=2, sample_width=16, sample_height=16, patch_size=2).eval()
    with seeded(seed, 2):
        vae = AutoencoderKLMagvit(
            in_channels=3, out_channels=3,
            down_block_types=("SpatialDownBlock3D",) + ("SpatialTemporalDownBlock3D",) * 3,
            up_block_types=("SpatialUpBlock3D",) + ("SpatialTemporalUpBlock3D",) * 3,
            block_out_channels=(8, 8, 8, 8), latent_channels=4, layers_per_block=1, norm_num_groups=2,
            spatial_group_norm=False).eval()
    token = tok.convert_tokens_to_ids
    with seeded(seed, 3):
        text_encoder = Qwen2VLForConditionalGeneration(Qwen2VLConfig(
            text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                         "num_key_value_heads": 2, "vocab_size": n, "rope_theta": 1000000.0,
                         "rope_scaling": _mrope([1, 1, 2])},
            vision_config={"depth": 2, "embed_dim": 16, "hidden_size": 16, "num_heads": 2, "mlp_ratio": 1},
            vocab_size=n, vision_start_token_id=token("<|vision_start|>"), vision_end_token_id=token("<|vision_end|>"),
            image_token_id=token("<|image_pad|>"), video_token_id=token("<|video_pad|>"))).eval()
    return EasyAnimatePipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
                               text_encoder=text_encoder, tokenizer=tok)


def make_kandinsky5_t2v_pipeline(seed: int):
    """Kandinsky 5 text-to-video: Qwen2.5-VL and CLIP encoders, a DiT with `text_transformer_blocks` and
    `visual_transformer_blocks`, the HunyuanVideo VAE."""
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        Kandinsky5T2VPipeline,
        Kandinsky5Transformer3DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    with seeded(seed, 1):
        vae = AutoencoderKLHunyuanVideo(
            act_fn="silu", block_out_channels=[32, 64], down_block_types=["HunyuanVideoDownBlock3D"] * 2,
            in_channels=3, latent_channels=16, layers_per_block=1, mid_block_add_attention=False, norm_num_groups=32,
            out_channels=3, scaling_factor=0.476986, spatial_compression_ratio=8, temporal_compression_ratio=4,
            up_block_types=["HunyuanVideoUpBlock3D"] * 2).eval()
    with seeded(seed, 2):
        text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
            text_config={"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                         "num_key_value_heads": 2, "rope_scaling": _mrope([2, 2, 4]), "rope_theta": 1000000.0},
            vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2,
                           "out_hidden_size": 32},
            hidden_size=32, vocab_size=152064, vision_end_token_id=151653, vision_start_token_id=151652,
            vision_token_id=151654)).eval()
    with seeded(seed, 3):
        text_encoder_2 = CLIPTextModel(CLIPTextConfig(
            bos_token_id=0, eos_token_id=2, hidden_size=16, intermediate_size=16, layer_norm_eps=1e-05,
            num_attention_heads=2, num_hidden_layers=2, pad_token_id=1, vocab_size=1000, projection_dim=16)).eval()
    with seeded(seed, 4):
        transformer = Kandinsky5Transformer3DModel(
            in_visual_dim=16, in_text_dim=32, in_text_dim2=16, time_dim=16, out_visual_dim=16, patch_size=(1, 2, 2),
            model_dim=16, ff_dim=32, num_text_blocks=2, num_visual_blocks=2, axes_dims=(1, 1, 2), visual_cond=False,
            attention_type="regular").eval()
    return Kandinsky5T2VPipeline(transformer=transformer, vae=vae, text_encoder=text_encoder,
                                 tokenizer=byte_qwen_vl_tokenizer(), text_encoder_2=text_encoder_2,
                                 tokenizer_2=build_clip_tokenizer(),
                                 scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))


def make_dreamlite_pipeline(seed: int):
    """DreamLite: a Qwen3-VL encoder and a `UNet2DConditionModel` subclass with its own blocks, a tiny VAE;
    its `processor` (edit mode only) is a tokenizer here."""
    from diffusers import AutoencoderTiny, DreamLitePipeline, DreamLiteUNetModel, FlowMatchEulerDiscreteScheduler
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    tok = byte_qwen_vl_tokenizer()
    with seeded(seed, 1):
        unet = DreamLiteUNetModel(
            sample_size=8, in_channels=4, out_channels=4,
            down_block_types=("DreamLiteCrossAttnNoSelfAttnDownBlock2D", "DreamLiteCrossAttnDownBlock2D"),
            up_block_types=("DreamLiteCrossAttnUpBlock2D", "DreamLiteUpBlock2D"), block_out_channels=(32, 64),
            cross_attention_dim=16, attention_head_dim=8, layers_per_block=1, norm_num_groups=8,
            transformer_layers_per_block=1).eval()
    with seeded(seed, 2):
        vae = AutoencoderTiny(in_channels=3, out_channels=3, encoder_block_out_channels=(32, 32),
                              decoder_block_out_channels=(32, 32), num_encoder_blocks=(1, 1),
                              num_decoder_blocks=(1, 1), latent_channels=4).eval()
    with seeded(seed, 3):
        text_encoder = Qwen3VLForConditionalGeneration(Qwen3VLConfig(
            text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                         "num_key_value_heads": 2, "rope_scaling": _mrope([1, 1, 2]), "rope_theta": 1000000.0,
                         "vocab_size": len(tok), "head_dim": 8},
            vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_channels": 16,
                           "out_hidden_size": 16, "patch_size": 14})).eval()
    return DreamLitePipeline(text_encoder=text_encoder, tokenizer=tok, processor=byte_qwen_vl_tokenizer(), vae=vae,
                             unet=unet, scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000))


QWEN_GENERATION: dict[str, dict[str, Any]] = {
    "z_image": {"height": 32, "width": 32, "num_inference_steps": 2, "max_sequence_length": 16},
    "ovis_image": {"height": 16, "width": 16, "num_inference_steps": 2, "max_sequence_length": 32},
    # the prompt rewrite (a 512-token generate by the encoder, on by default) is off to keep the test short
    "longcat_image": {"height": 16, "width": 16, "num_inference_steps": 2, "enable_prompt_rewrite": False},
    # the encoder's layers 1-3 (diffusers' default 9, 18, 27 needs 28 of them)
    "flux2_klein": {"height": 16, "width": 16, "num_inference_steps": 2, "max_sequence_length": 64,
                    "text_encoder_out_layers": (1, 2, 3)},
    "hunyuan_image_21": {"height": 32, "width": 32, "num_inference_steps": 4},  # APG from step 2
    "krea2": {"height": 32, "width": 32, "num_inference_steps": 2, "max_sequence_length": 16},
    "nucleusmoe_image": {"height": 32, "width": 32, "num_inference_steps": 2, "max_sequence_length": 16,
                         "return_index": -1},  # the default -8 needs an encoder of 8+ layers' outputs kept
    "easyanimate": {"height": 16, "width": 16, "num_frames": 5, "num_inference_steps": 2},
    "kandinsky5_t2v": {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2,
                       "max_sequence_length": 8},
    "dreamlite": {"height": 32, "width": 32, "num_inference_steps": 2, "max_sequence_length": 256},
}
"""Small call kwargs per family, as diffusers' tests pass them (what the CLI can pass too)."""
QWEN_MAKERS: dict[str, tuple[Callable[[int], Any], dict[str, str]]] = {
    "z_image": (make_z_image_pipeline, {}),
    "ovis_image": (make_ovis_image_pipeline, {}),
    "longcat_image": (make_longcat_image_pipeline, {}),
    "flux2_klein": (make_flux2_klein_pipeline, {}),
    "hunyuan_image_21": (make_hunyuan_image_21_pipeline, {}),
    "krea2": (make_krea2_pipeline, {}),
    "nucleusmoe_image": (make_nucleusmoe_image_pipeline, {}),
    "easyanimate": (make_easyanimate_pipeline, {}),
    "kandinsky5_t2v": (make_kandinsky5_t2v_pipeline, {}),
    "dreamlite": (make_dreamlite_pipeline, {}),
}
