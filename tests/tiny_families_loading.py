"""Tiny random-weight pipelines that test *how* a directory is built into a pipeline (issue 22, items 1-3, 7).

Each family here depends on something beyond its components: pipeline-level values in
`model_index.json` (Wan 2.2's `boundary_ratio`, `expand_timesteps`; SD1.5's `requires_safety_checker`;
Mochi's `force_zeros_for_empty_prompt`), components saved as `[null, null]` (SD1.5 without a safety
checker, Wan 2.2 TI2V image-to-video without an image encoder), a diffusers class under a pipeline
"library" (SD1.5's `["stable_diffusion", "StableDiffusionSafetyChecker"]`), or bit-exactness of its
VAE (Mochi); HunyuanVideo, Chroma, Sana and QwenImage (tokenizers built offline, a T5 or byte-level one
standing in for Llama's and Gemma's) check that the rest of the hub's families load the same way.
Written with the pipeline's own `save_pretrained` layout (`pipeline_save.save_pipeline`),
configs as small as diffusers' own tests use, each component under its own derived seed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from omni_console.engine.demo.build_dir import atomic_build
from omni_console.engine.demo.demo_model import seeded, tiny_clip_text_config, tiny_t5_config, tiny_vae
from omni_console.engine.demo.pipeline_save import save_pipeline

T5_LAYOUT = {"tokenizer": "T5TokenizerFast"}

LOADING_GENERATION: dict[str, dict[str, Any]] = {
    "wan22_a14b": {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 4, "max_sequence_length": 16},
    "wan22_ti2v": {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2, "max_sequence_length": 16},
    "wan22_ti2v_i2v": {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2,
                       "max_sequence_length": 16},
    "wan21_i2v": {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2, "max_sequence_length": 16},
    "sd15": {"height": 32, "width": 32, "num_inference_steps": 2},
    "sd15_no_checker": {"height": 32, "width": 32, "num_inference_steps": 2},
    "mochi": {"height": 16, "width": 16, "num_frames": 7, "num_inference_steps": 2, "max_sequence_length": 16},
    "hunyuan_video": {"height": 16, "width": 16, "num_frames": 5, "num_inference_steps": 2,
                      "max_sequence_length": 16},
    "chroma": {"height": 32, "width": 32, "num_inference_steps": 2, "max_sequence_length": 16},
    # Sana's DC-AE compresses 2x here (one down block); binning would pick a 1024 px bin and resize
    "sana": {"height": 32, "width": 32, "num_inference_steps": 2, "max_sequence_length": 16,
             "use_resolution_binning": False},
    "qwen_image": {"height": 32, "width": 32, "num_inference_steps": 2, "max_sequence_length": 16},
}
"""Small call kwargs per family; 4 steps for Wan 2.2 A14B so both experts get steps at boundary_ratio 0.875."""


def _t5(seed: int, index: int, *, umt5: bool = False, d_model: int = 32) -> tuple[Any, Any]:
    from transformers import T5EncoderModel, UMT5EncoderModel

    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    tok = build_t5_tokenizer()
    with seeded(seed, index):
        cls = UMT5EncoderModel if umt5 else T5EncoderModel
        encoder = cls(tiny_t5_config(len(tok), d_model=d_model, umt5=umt5)).eval()
    return tok, encoder


def _wan_transformer(seed: int, index: int, *, in_channels: int = 16, out_channels: int = 16,
                     image_dim: int | None = None):
    from diffusers import WanTransformer3DModel

    with seeded(seed, index):
        return WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16, in_channels=in_channels,
            out_channels=out_channels, text_dim=32, freq_dim=32, ffn_dim=128, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32, image_dim=image_dim,
        ).eval()


def _wan_vae(seed: int, index: int):
    from diffusers import AutoencoderKLWan

    with seeded(seed, index):
        return AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                temperal_downsample=[False, True, True]).eval()


def _wan22_vae(seed: int, index: int):
    """Wan 2.2's 48-channel residual VAE with 2x2 patching (16x spatial)."""
    from diffusers import AutoencoderKLWan

    with seeded(seed, index):
        return AutoencoderKLWan(base_dim=8, in_channels=12, out_channels=12, is_residual=True, patch_size=2,
                                z_dim=48, latents_mean=[0.0] * 48, latents_std=[1.0] * 48, dim_mult=[1, 1, 1, 1],
                                num_res_blocks=1, scale_factor_spatial=16, scale_factor_temporal=4,
                                temperal_downsample=[False, True, True]).eval()


def _unipc():
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True,
                                   flow_shift=3.0, solver_order=2)


def make_wan22_a14b_pipeline(seed: int):
    """Wan 2.2 A14B: a high-noise `transformer` and a low-noise `transformer_2`, switched at `boundary_ratio`."""
    from diffusers import WanPipeline

    tok, encoder = _t5(seed, 1, umt5=True)
    return WanPipeline(tokenizer=tok, text_encoder=encoder, vae=_wan_vae(seed, 3), scheduler=_unipc(),
                       transformer=_wan_transformer(seed, 2), transformer_2=_wan_transformer(seed, 4),
                       boundary_ratio=0.875)


def make_wan22_ti2v_pipeline(seed: int):
    """Wan 2.2 TI2V-5B text-to-video: one DiT, the 48-channel VAE, `expand_timesteps: true`."""
    from diffusers import WanPipeline

    tok, encoder = _t5(seed, 1, umt5=True)
    return WanPipeline(tokenizer=tok, text_encoder=encoder, vae=_wan22_vae(seed, 3), scheduler=_unipc(),
                       transformer=_wan_transformer(seed, 2, in_channels=48, out_channels=48), expand_timesteps=True)


def make_wan22_ti2v_i2v_pipeline(seed: int):
    """Wan 2.2 TI2V-5B image-to-video: no image encoder (saved as `[null, null]`), `expand_timesteps: true`."""
    from diffusers import WanImageToVideoPipeline

    tok, encoder = _t5(seed, 1, umt5=True)
    return WanImageToVideoPipeline(tokenizer=tok, text_encoder=encoder, vae=_wan22_vae(seed, 3), scheduler=_unipc(),
                                   transformer=_wan_transformer(seed, 2, in_channels=48, out_channels=48),
                                   expand_timesteps=True)


def make_wan21_i2v_pipeline(seed: int):
    """Wan 2.1 image-to-video: CLIP vision encoder and image processor, DiT with image cross-attention."""
    from diffusers import WanImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    tok, encoder = _t5(seed, 1, umt5=True)
    with seeded(seed, 5):
        image_encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(
            hidden_size=4, projection_dim=4, num_hidden_layers=2, num_attention_heads=2, image_size=32,
            intermediate_size=16, patch_size=1)).eval()
    return WanImageToVideoPipeline(
        tokenizer=tok, text_encoder=encoder, vae=_wan_vae(seed, 3), scheduler=_unipc(),
        image_processor=CLIPImageProcessor(crop_size=32, size=32), image_encoder=image_encoder,
        transformer=_wan_transformer(seed, 2, in_channels=36, image_dim=4))


def _sd15_pipeline(seed: int, with_checker: bool):
    from diffusers import PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPTextModel

    from omni_console.engine.demo.tokenizers_offline import build_clip_tokenizer

    tok = build_clip_tokenizer()
    with seeded(seed, 1):
        text_encoder = CLIPTextModel(tiny_clip_text_config(len(tok), hidden=32)).eval()
    with seeded(seed, 2):
        unet = UNet2DConditionModel(block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4,
                                    out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                                    norm_num_groups=4, attention_head_dim=4).eval()
    with seeded(seed, 3):
        vae = tiny_vae(latent_channels=4, scaling_factor=0.18215, shift_factor=None)
    scheduler = PNDMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", skip_prk_steps=True,
                              steps_offset=1)
    checker, extractor = None, None
    if with_checker:
        with seeded(seed, 4):
            config = CLIPConfig(text_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                             "num_attention_heads": 2, "vocab_size": 64},
                                vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                               "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
                                projection_dim=16)
            checker = StableDiffusionSafetyChecker(config).eval()
        extractor = CLIPImageProcessor(crop_size=32, size=32)
    return StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tok, unet=unet, scheduler=scheduler,
                                   safety_checker=checker, feature_extractor=extractor,
                                   requires_safety_checker=with_checker)


def make_sd15_pipeline(seed: int):
    """SD1.5 as on the hub: the safety checker saved as `["stable_diffusion", "StableDiffusionSafetyChecker"]`."""
    return _sd15_pipeline(seed, with_checker=True)


def make_sd15_no_checker_pipeline(seed: int):
    """SD1.5 without a safety checker: `safety_checker` and `feature_extractor` saved as `[null, null]`."""
    return _sd15_pipeline(seed, with_checker=False)


def make_mochi_pipeline(seed: int):
    """Mochi: T5, asymmetric DiT, the Mochi VAE (whose decode was 3.6e-7 off after `requires_grad_(False)`)."""
    from diffusers import AutoencoderKLMochi, FlowMatchEulerDiscreteScheduler, MochiPipeline, MochiTransformer3DModel

    tok, encoder = _t5(seed, 1)
    with seeded(seed, 2):
        transformer = MochiTransformer3DModel(
            patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=2, pooled_projection_dim=16,
            in_channels=12, out_channels=None, qk_norm="rms_norm", text_embed_dim=32, time_embed_dim=4,
            activation_fn="swiglu", max_sequence_length=16).eval()
    with seeded(seed, 3):
        vae = AutoencoderKLMochi(latent_channels=12, out_channels=3, encoder_block_out_channels=(32, 32, 32, 32),
                                 decoder_block_out_channels=(32, 32, 32, 32), layers_per_block=(1, 1, 1, 1, 1)).eval()
    return MochiPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=encoder, tokenizer=tok,
                         transformer=transformer, force_zeros_for_empty_prompt=True)


def make_hunyuan_video_pipeline(seed: int):
    """HunyuanVideo: a Llama text encoder (T5 tokenizer offline) + CLIP, dual- and single-stream blocks."""
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import CLIPTextModel, LlamaConfig, LlamaModel

    from omni_console.engine.demo.tokenizers_offline import build_clip_tokenizer, build_t5_tokenizer

    tok, clip_tok = build_t5_tokenizer(), build_clip_tokenizer()
    with seeded(seed, 1):
        text_encoder = LlamaModel(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                              max_position_embeddings=512, pad_token_id=0)).eval()
    with seeded(seed, 2):
        text_encoder_2 = CLIPTextModel(tiny_clip_text_config(len(clip_tok), hidden=8)).eval()
    with seeded(seed, 3):
        transformer = HunyuanVideoTransformer3DModel(
            in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
            num_single_layers=2, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
            text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4)).eval()
    with seeded(seed, 4):
        vae = AutoencoderKLHunyuanVideo(
            in_channels=3, out_channels=3, latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 4,
            up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
            act_fn="silu", norm_num_groups=4, scaling_factor=0.476986, spatial_compression_ratio=8,
            temporal_compression_ratio=4, mid_block_add_attention=True).eval()
    return HunyuanVideoPipeline(text_encoder=text_encoder, tokenizer=tok, transformer=transformer, vae=vae,
                                scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=text_encoder_2,
                                tokenizer_2=clip_tok)


def make_chroma_pipeline(seed: int):
    """Chroma: T5 only, Flux-like DiT whose modulation comes from an approximator (no pooled CLIP)."""
    from diffusers import ChromaPipeline, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler

    tok, encoder = _t5(seed, 1)
    with seeded(seed, 2):
        transformer = ChromaTransformer2DModel(
            patch_size=1, in_channels=64, num_layers=1, num_single_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 6, 6), approximator_hidden_dim=32,
            approximator_layers=1, approximator_num_channels=16).eval()
    with seeded(seed, 3):
        vae = tiny_vae(latent_channels=16, scaling_factor=0.3611, shift_factor=0.1159)
    return ChromaPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=encoder, tokenizer=tok,
                          transformer=transformer)


def make_sana_pipeline(seed: int):
    """Sana: a Gemma2 text encoder (T5 tokenizer offline), linear-attention DiT, the DC-AE VAE."""
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel
    from transformers import Gemma2Config, Gemma2Model

    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    tok = build_t5_tokenizer()
    with seeded(seed, 1):
        text_encoder = Gemma2Model(Gemma2Config(
            head_dim=16, hidden_size=8, intermediate_size=64, max_position_embeddings=512, num_attention_heads=2,
            num_hidden_layers=1, num_key_value_heads=2, vocab_size=len(tok), pad_token_id=0)).eval()
    with seeded(seed, 2):
        transformer = SanaTransformer2DModel(
            patch_size=1, in_channels=4, out_channels=4, num_layers=2, num_attention_heads=2, attention_head_dim=4,
            num_cross_attention_heads=2, cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=8,
            sample_size=32).eval()
    with seeded(seed, 3):
        vae = AutoencoderDC(
            in_channels=3, latent_channels=4, attention_head_dim=2,
            encoder_block_types=("ResBlock", "EfficientViTBlock"),
            decoder_block_types=("ResBlock", "EfficientViTBlock"), encoder_block_out_channels=(8, 8),
            decoder_block_out_channels=(8, 8), encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
            encoder_layers_per_block=(1, 1), decoder_layers_per_block=(1, 1), downsample_block_type="conv",
            upsample_block_type="interpolate", decoder_norm_types="rms_norm", decoder_act_fns="silu",
            scaling_factor=0.41407).eval()
    return SanaPipeline(tokenizer=tok, text_encoder=text_encoder, vae=vae, transformer=transformer,
                        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))


def make_qwen_image_pipeline(seed: int):
    """QwenImage: a Qwen2.5-VL text encoder with a byte-level tokenizer built offline, MMDiT, the Qwen VAE."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        vocab[special] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=[])  # every byte its own token: no download needed
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    n = len(vocab)
    with seeded(seed, 1):
        text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
            text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                         "num_key_value_heads": 2, "rope_theta": 1000000.0, "vocab_size": n, "bos_token_id": n - 3,
                         "eos_token_id": n - 1,
                         "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"}},
            vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                           "out_hidden_size": 16},
            hidden_size=16, vocab_size=n, vision_start_token_id=n, vision_end_token_id=n + 1,
            vision_token_id=n + 2)).eval()
    with seeded(seed, 2):
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=3,
            joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4)).eval()
    with seeded(seed, 3):
        vae = AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                     temperal_downsample=[False, True], latents_mean=[0.0] * 4,
                                     latents_std=[1.0] * 4).eval()
    return QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                             tokenizer=tok, transformer=transformer)


MAKERS: dict[str, tuple[Callable[[int], Any], dict[str, str]]] = {
    "wan22_a14b": (make_wan22_a14b_pipeline, T5_LAYOUT),
    "wan22_ti2v": (make_wan22_ti2v_pipeline, T5_LAYOUT),
    "wan22_ti2v_i2v": (make_wan22_ti2v_i2v_pipeline, T5_LAYOUT),
    "wan21_i2v": (make_wan21_i2v_pipeline, T5_LAYOUT),
    "sd15": (make_sd15_pipeline, {}),
    "sd15_no_checker": (make_sd15_no_checker_pipeline, {}),
    "mochi": (make_mochi_pipeline, T5_LAYOUT),
    "hunyuan_video": (make_hunyuan_video_pipeline, {}),
    "chroma": (make_chroma_pipeline, T5_LAYOUT),
    "sana": (make_sana_pipeline, {}),
    "qwen_image": (make_qwen_image_pipeline, {}),
}


def build_tiny_loading_family(family: str, path: Path, seed: int = 0) -> Path:
    """Write family `family` of `MAKERS` to `path` (atomically; an identical earlier build is kept)."""
    make, layout = MAKERS[family]

    def build(tmp: Path) -> None:
        save_pipeline(make(seed), tmp, class_names=layout)

    return atomic_build(Path(path), build, {"family": family, "seed": seed})


def stand_in_for_ftfy(monkeypatch, *modules: str) -> None:
    """Wan-family pipelines clean prompts with `ftfy`; without it installed plain diffusers and the engine
    fail alike. Its `fix_text` leaves an ASCII prompt as it is, so a stand-in in `modules` is faithful."""
    import importlib
    import importlib.util
    from types import SimpleNamespace

    if importlib.util.find_spec("ftfy") is None:
        for name in modules:
            module = importlib.import_module(name)
            monkeypatch.setattr(module, "ftfy", SimpleNamespace(fix_text=lambda text: text), raising=False)
