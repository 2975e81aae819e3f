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
    # PRX bins to its default_sample_size (512 px) and resizes back unless told not to, as its test does
    "prx": {"height": 32, "width": 32, "num_inference_steps": 2, "use_resolution_binning": False},
    "hunyuan_video15": {"height": 16, "width": 16, "num_frames": 9, "num_inference_steps": 2},
    # diffusers' LTX-2 test pins the legacy sampling knobs (no STG, no modality/rescale, no cross-timestep)
    "ltx2": {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2, "max_sequence_length": 16,
             "frame_rate": 25.0, "stg_scale": 0.0, "modality_scale": 1.0, "guidance_rescale": 0.0,
             "audio_guidance_scale": 1.0, "audio_stg_scale": 0.0, "audio_modality_scale": 1.0,
             "audio_guidance_rescale": 0.0, "spatio_temporal_guidance_blocks": None, "use_cross_timestep": False},
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


PRX_ENCODER = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 4, "max_position_embeddings": 64,
               "layer_types": ["full_attention"] * 3, "attention_bias": False, "attention_dropout": 0.0,
               "dropout_rate": 0.0, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06,
               "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 4,
               "rope_theta": 10000.0, "sliding_window": 4096}
"""diffusers' PRX test's T5Gemma encoder, with three layers (more than the two slots that streaming an
encoder layer by layer takes, so `stream_encoders` applies)."""


def make_prx_pipeline(seed: int):
    """PRX as diffusers' fast test builds it (a 2-block DiT here, so it streams): a `T5GemmaEncoder` text
    encoder whose saved config is the composite `T5GemmaConfig` that diffusers' prx package unwraps on load
    (as PRX checkpoints ship it), a one-block AutoencoderKL, flow-match Euler."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, PRXPipeline, PRXTransformer2DModel
    from transformers.models.t5gemma.configuration_t5gemma import T5GemmaConfig
    from transformers.models.t5gemma.modeling_t5gemma import T5GemmaEncoder

    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    tok = build_t5_tokenizer(model_max_length=64)
    with seeded(seed, 1):
        module = {**PRX_ENCODER, "vocab_size": len(tok)}
        config = T5GemmaConfig(encoder=module, decoder=module, is_encoder_decoder=False, vocab_size=len(tok))
        encoder = T5GemmaEncoder(config.encoder).eval()
        encoder.config = config  # saved as the composite config, as PRX checkpoints are
    with seeded(seed, 2):
        transformer = PRXTransformer2DModel(patch_size=1, in_channels=4, context_in_dim=8, hidden_size=8,
                                            mlp_ratio=2.0, num_heads=2, depth=2, axes_dim=[2, 2]).eval()
    with seeded(seed, 3):
        vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,),
                            layers_per_block=1, latent_channels=4, norm_num_groups=1, use_quant_conv=False,
                            use_post_quant_conv=False, shift_factor=0.0, scaling_factor=1.0).eval()
    return PRXPipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
                       text_encoder=encoder, tokenizer=tok)


QWEN_CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
                      "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                      "{% endif %}")
"""Qwen2's chat template (string contents), which HunyuanVideo 1.5 applies to its prompt."""


def _byte_qwen_tokenizer():
    """A byte-level Qwen2 tokenizer built offline (every byte its own token), as `tiny_families_loading`'s."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import Qwen2Tokenizer

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        vocab[special] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=[])
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = QWEN_CHAT_TEMPLATE
    return tok


def make_hunyuan_video15_pipeline(seed: int):
    """HunyuanVideo 1.5 as diffusers' fast test builds it (two DiT blocks here, so it streams): a Qwen2.5-VL
    text model, a ByT5 encoder (a tiny T5), the 1.5 VAE, and a `ClassifierFreeGuidance` guider (config only)."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline,
        HunyuanVideo15Transformer3DModel,
    )
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel, T5Config, T5EncoderModel

    with seeded(seed, 1):
        transformer = HunyuanVideo15Transformer3DModel(
            in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
            num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=16,
            text_embed_2_dim=32, image_embed_dim=12, rope_axes_dim=(2, 2, 4), target_size=16, task_type="t2v").eval()
    with seeded(seed, 2):
        vae = AutoencoderKLHunyuanVideo15(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 16), layers_per_block=1,
            spatial_compression_ratio=4, temporal_compression_ratio=2, downsample_match_channel=False,
            upsample_match_channel=False).eval()
    tok = _byte_qwen_tokenizer()
    with seeded(seed, 3):
        text_encoder = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(
            hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
            vocab_size=len(tok), rope_theta=1000000.0,
            rope_scaling={"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"})).eval()
    tok_2 = ByT5Tokenizer()
    with seeded(seed, 4):  # hf-internal-testing/tiny-random-t5's shape, over ByT5's vocabulary
        text_encoder_2 = T5EncoderModel(T5Config(
            vocab_size=len(tok_2), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8, decoder_start_token_id=0)).eval()
    return HunyuanVideo15Pipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=text_encoder, text_encoder_2=text_encoder_2, tokenizer=tok, tokenizer_2=tok_2,
        guider=ClassifierFreeGuidance(guidance_scale=1.0))


def _tiny_gemma3(seed: int, index: int, vocab_size: int):
    """A Gemma3ForConditionalGeneration of hf-internal-testing/tiny-gemma3's kind (built, not downloaded)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 8, "vocab_size": vocab_size, "max_position_embeddings": 128,
            "sliding_window": 16, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    vision = {"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 16, "patch_size": 8}
    with seeded(seed, index):
        return Gemma3ForConditionalGeneration(Gemma3Config(
            text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=vocab_size - 1,
            boi_token_index=vocab_size - 2, eoi_token_index=vocab_size - 3)).eval()


def make_ltx2_pipeline(seed: int):
    """LTX-2 as diffusers' fast tests build it: a Gemma 3 text encoder (a T5 tokenizer offline), the audio-video
    DiT, text connectors, video and audio VAEs and a vocoder from diffusers' own ltx2 package."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    tok = build_t5_tokenizer(model_max_length=64)
    text_encoder = _tiny_gemma3(seed, 1, len(tok))
    hidden, layers = 32, 2  # the connectors emit 4 heads x 8 = 32 wide, as the text encoder's hidden size
    with seeded(seed, 2):
        transformer = LTX2VideoTransformer3DModel(
            in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
            cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
            audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, qk_norm="rms_norm_across_heads",
            caption_channels=hidden, rope_double_precision=False, rope_type="split").eval()
    with seeded(seed, 3):
        connectors = LTX2TextConnectors(
            caption_channels=hidden, text_proj_in_factor=layers + 1, video_connector_num_attention_heads=4,
            video_connector_attention_head_dim=8, video_connector_num_layers=1,
            video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=4,
            audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
            audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32, rope_theta=10000.0,
            rope_double_precision=False, causal_temporal_positioning=False, rope_type="split").eval()
    with seeded(seed, 4):
        vae = AutoencoderKLLTX2Video(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,),
            decoder_block_out_channels=(8,), layers_per_block=(1,), decoder_layers_per_block=(1, 1),
            spatio_temporal_scaling=(True,), decoder_spatio_temporal_scaling=(True,),
            decoder_inject_noise=(False, False), downsample_type=("spatial",), upsample_residual=(False,),
            upsample_factor=(1,), timestep_conditioning=False, patch_size=1, patch_size_t=1, encoder_causal=True,
            decoder_causal=False).eval()
    with seeded(seed, 5):
        audio_vae = AutoencoderKLLTX2Audio(
            base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None, in_channels=2,
            resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height", dropout=0.0,
            mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=8).eval()
    with seeded(seed, 6):
        vocoder = LTX2Vocoder(
            in_channels=2 * 8, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4],
            upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
            leaky_relu_negative_slope=0.1, output_sampling_rate=16000).eval()
    return LTX2Pipeline(transformer=transformer, vae=vae, audio_vae=audio_vae,
                        scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=text_encoder, tokenizer=tok,
                        connectors=connectors, vocoder=vocoder)


MAKERS: dict[str, tuple[Callable[[int], Any], dict[str, str]]] = {
    "pixart_sigma_8": (make_pixart_sigma_8_pipeline, {"tokenizer": "T5TokenizerFast"}),
    "prx": (make_prx_pipeline, {"tokenizer": "T5TokenizerFast"}),
    "hunyuan_video15": (make_hunyuan_video15_pipeline, {}),
    "ltx2": (make_ltx2_pipeline, {"tokenizer": "T5TokenizerFast"}),
}


def build_tiny_new_family(family: str, path: Path, seed: int = 0) -> Path:
    """Write family `family` of `MAKERS` to `path` (atomically; an identical earlier build is kept)."""
    make, layout = MAKERS[family]

    def build(tmp: Path) -> None:
        save_pipeline(make(seed), tmp, class_names=layout)

    return atomic_build(Path(path), build, {"family": family, "seed": seed})
