"""Tiny pipelines of FLUX.2 (a Mistral 3 encoder), HiDream-I1 (two CLIPs, T5 and Llama), OmniGen (its own Phi-3
inside the DiT), Cosmos-Predict2 text-to-image, CogView3-Plus, SANA-Sprint, GLM-Image (an autoregressive prior
before the DiT), Motif-Video, Ideogram 4 (two DiTs; its encoder run layer by layer by the pipeline) and SANA-WM
(image-to-video, unbatched frames), built as diffusers' tests/pipelines/<family>/test_*.py `get_dummy_components`
builds them, with every block list at least two blocks long. Tokenizers are built offline.

FLUX.2's real tokenizer is a `PixtralProcessor`, which transformers builds only with torchvision: a byte-level
tokenizer with Mistral's special tokens and chat template stands in (the pipeline calls only
`apply_chat_template` on it). OmniGen and Cosmos need the stand-ins of `optional_stand_ins`.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiny_families_loading import _t5

from omni_console.engine.demo.demo_model import seeded
from omni_console.engine.demo.tokenizers_offline import build_clip_tokenizer, build_t5_tokenizer


def _byte_bpe(specials: list[str], *, first: bool = False, bos: str | None = None):
    """A byte-level BPE tokenizer object (every byte a token) with `specials` before (`first`) or after the bytes;
    `bos`: prepended to every encoding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    ordered = [*specials, *alphabet] if first else [*alphabet, *specials]
    vocab = {token: i for i, token in enumerate(ordered)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    if bos is not None:
        core.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                            special_tokens=[(bos, vocab[bos])])
    return core


MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['content'] is string %}{% set text = message['content'] %}"
    "{% else %}{% set text = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text')"
    " | join('') %}{% endif %}"
    "{% if message['role'] == 'system' %}{{ '[SYSTEM_PROMPT]' + text + '[/SYSTEM_PROMPT]' }}"
    "{% elif message['role'] == 'user' %}{{ '[INST]' + text + '[/INST]' }}"
    "{% else %}{{ text + eos_token }}{% endif %}{% endfor %}")
_MISTRAL_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "<pad>", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]",
                     "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]


def make_flux2_pipeline(seed: int):
    """FLUX.2 [dev]: a Mistral 3 encoder whose chosen hidden layers feed a DiT with `transformer_blocks` and
    `single_transformer_blocks`."""
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2Pipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=_byte_bpe(_MISTRAL_SPECIALS, first=True), unk_token="<unk>",
                                  bos_token="<s>", eos_token="</s>", pad_token="<pad>", model_max_length=1024,
                                  additional_special_tokens=_MISTRAL_SPECIALS[3:])
    tok.chat_template = MISTRAL_TEMPLATE
    with seeded(seed, 1):
        transformer = Flux2Transformer2DModel(
            patch_size=1, in_channels=4, num_layers=2, num_single_layers=2, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=48, timestep_guidance_channels=256,
            axes_dims_rope=[4, 4, 4, 4]).eval()
    config = Mistral3Config(
        text_config={"model_type": "mistral", "vocab_size": len(tok), "hidden_size": 16, "intermediate_size": 37,
                     "max_position_embeddings": 512, "num_attention_heads": 4, "num_hidden_layers": 3,
                     "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0,
                     "sliding_window": None, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 4},
        vision_config={"model_type": "pixtral", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 4,
                       "intermediate_size": 37, "image_size": 30, "patch_size": 6, "num_channels": 3},
        bos_token_id=1, eos_token_id=2, pad_token_id=4, image_seq_length=4, vision_feature_layer=-1,
        image_token_index=6)
    with seeded(seed, 2):
        text_encoder = Mistral3ForConditionalGeneration(config).eval()
    with seeded(seed, 3):
        vae = AutoencoderKLFlux2(sample_size=32, in_channels=3, out_channels=3,
                                 down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",),
                                 block_out_channels=(4,), layers_per_block=1,
                                 latent_channels=1, norm_num_groups=1, use_quant_conv=False,
                                 use_post_quant_conv=False).eval()
    return Flux2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder=text_encoder, tokenizer=tok,
                         transformer=transformer, vae=vae)


def make_hidream_image_pipeline(seed: int):
    """HiDream-I1: two CLIP encoders, T5 and a Llama whose every layer feeds the DiT (an MoE feed-forward)."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        HiDreamImagePipeline,
        HiDreamImageTransformer2DModel,
    )
    from transformers import (
        CLIPTextConfig,
        CLIPTextModelWithProjection,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    with seeded(seed, 1):  # llama_layers: one encoder layer per DiT block (4)
        transformer = HiDreamImageTransformer2DModel(
            patch_size=2, in_channels=4, out_channels=4, num_layers=2, num_single_layers=2, attention_head_dim=8,
            num_attention_heads=4, caption_channels=[32, 16], text_emb_dim=64, num_routed_experts=4,
            num_activated_experts=2, axes_dims_rope=(4, 2, 2), max_resolution=(32, 32),
            llama_layers=(0, 1, 2, 1)).eval()
    with seeded(seed, 2):
        vae = AutoencoderKL(scaling_factor=0.3611, shift_factor=0.1159).eval()
    tok, tok_2 = build_clip_tokenizer(77), build_clip_tokenizer(77)
    clip = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "hidden_size": 32,
            "intermediate_size": 37, "layer_norm_eps": 1e-05, "num_attention_heads": 4, "num_hidden_layers": 2,
            "pad_token_id": tok.pad_token_id, "vocab_size": len(tok), "hidden_act": "gelu", "projection_dim": 32,
            "max_position_embeddings": 128}
    with seeded(seed, 3):
        text_encoder = CLIPTextModelWithProjection(CLIPTextConfig(**clip)).eval()
    with seeded(seed, 4):
        text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(**clip)).eval()
    tok_3, text_encoder_3 = _t5(seed, 5)
    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    tok_4 = PreTrainedTokenizerFast(tokenizer_object=_byte_bpe([bos, eos], bos=bos), bos_token=bos, eos_token=eos,
                                    model_max_length=131072)
    with seeded(seed, 6):
        text_encoder_4 = LlamaForCausalLM(LlamaConfig(
            hidden_size=16, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            vocab_size=len(tok_4), max_position_embeddings=2048, bos_token_id=tok_4.bos_token_id,
            eos_token_id=tok_4.eos_token_id, pad_token_id=tok_4.eos_token_id)).eval()
    text_encoder_4.generation_config.pad_token_id = tok_4.eos_token_id
    return HiDreamImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder, tokenizer=tok,
        text_encoder_2=text_encoder_2, tokenizer_2=tok_2, text_encoder_3=text_encoder_3, tokenizer_3=tok_3,
        text_encoder_4=text_encoder_4, tokenizer_4=tok_4, transformer=transformer)


def _llama_char_tokenizer():
    """An offline Llama tokenizer: single characters with byte fallback (no merges)."""
    from transformers import LlamaTokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for char in ["\u2581", *string.ascii_letters, *string.digits, *string.punctuation]:
        vocab.setdefault(char, len(vocab))
    return LlamaTokenizer(vocab=vocab, merges=[])


def make_omnigen_pipeline(seed: int):
    """OmniGen: no text encoder component (the DiT is a Phi-3 over text and image tokens, `layers`)."""
    import pytest
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, OmniGenPipeline, OmniGenTransformer2DModel
    from optional_stand_ins import stand_in_for_torchvision

    with seeded(seed, 1):
        transformer = OmniGenTransformer2DModel(
            hidden_size=16, num_attention_heads=4, num_key_value_heads=4, intermediate_size=32, num_layers=2,
            in_channels=4, time_step_dim=4, rope_scaling={"long_factor": [1, 2], "short_factor": [1, 2]}).eval()
    with seeded(seed, 2):
        vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4, 4, 4, 4),
                            layers_per_block=1, latent_channels=4, norm_num_groups=1,
                            up_block_types=["UpDecoderBlock2D"] * 4).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(invert_sigmas=True, num_train_timesteps=1)
    with pytest.MonkeyPatch.context() as patch:  # its processor is built in __init__
        stand_in_for_torchvision(patch)
        return OmniGenPipeline(transformer=transformer, vae=vae, scheduler=scheduler, tokenizer=_llama_char_tokenizer())


def make_cosmos_pipeline(seed: int):
    """Cosmos-Predict2 text-to-image: T5, a DiT with `transformer_blocks`, the Wan VAE; the guardrail is saved
    as `[null, null]` (the pipeline builds it at load)."""
    from diffusers import (
        AutoencoderKLWan,
        Cosmos2TextToImagePipeline,
        CosmosTransformer3DModel,
        FlowMatchEulerDiscreteScheduler,
    )
    from optional_stand_ins import dummy_cosmos_safety_checker_class

    with seeded(seed, 1):
        transformer = CosmosTransformer3DModel(
            in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=16, num_layers=2, mlp_ratio=2,
            text_embed_dim=32, adaln_lora_dim=4, max_size=(4, 32, 32), patch_size=(1, 2, 2), rope_scale=(2.0, 1.0, 1.0),
            concat_padding_mask=True, extra_pos_embed_type="learnable").eval()
    with seeded(seed, 2):
        vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True]).eval()
    tok, text_encoder = _t5(seed, 3)
    pipe = Cosmos2TextToImagePipeline(
        transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(use_karras_sigmas=True),
        text_encoder=text_encoder, tokenizer=tok, safety_checker=dummy_cosmos_safety_checker_class()())
    pipe.register_modules(safety_checker=None)
    return pipe


def make_cogview3_pipeline(seed: int):
    """CogView3-Plus: T5, a DiT with `transformer_blocks`, CogVideoX's DDIM scheduler."""
    from diffusers import AutoencoderKL, CogVideoXDDIMScheduler, CogView3PlusPipeline, CogView3PlusTransformer2DModel

    with seeded(seed, 1):
        transformer = CogView3PlusTransformer2DModel(
            patch_size=2, in_channels=4, num_layers=2, attention_head_dim=4, num_attention_heads=2, out_channels=4,
            text_embed_dim=32, time_embed_dim=8, condition_dim=2, pos_embed_max_size=8, sample_size=8).eval()
    with seeded(seed, 2):
        vae = AutoencoderKL(block_out_channels=[32, 64], in_channels=3, out_channels=3,
                            down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                            latent_channels=4, sample_size=128).eval()
    tok, text_encoder = _t5(seed, 3)
    return CogView3PlusPipeline(transformer=transformer, vae=vae, scheduler=CogVideoXDDIMScheduler(),
                                text_encoder=text_encoder, tokenizer=tok)


def make_sana_sprint_pipeline(seed: int):
    """SANA-Sprint: a Gemma 2 encoder (a T5 tokenizer offline), SANA's DiT with guidance embeds, SCM."""
    from diffusers import AutoencoderDC, SanaSprintPipeline, SanaTransformer2DModel, SCMScheduler
    from transformers import Gemma2Config, Gemma2Model

    tok = build_t5_tokenizer()
    with seeded(seed, 1):
        transformer = SanaTransformer2DModel(
            patch_size=1, in_channels=4, out_channels=4, num_layers=2, num_attention_heads=2, attention_head_dim=4,
            num_cross_attention_heads=2, cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=8,
            sample_size=32, qk_norm="rms_norm_across_heads", guidance_embeds=True).eval()
    with seeded(seed, 2):
        vae = AutoencoderDC(
            in_channels=3, latent_channels=4, attention_head_dim=2,
            encoder_block_types=("ResBlock", "EfficientViTBlock"),
            decoder_block_types=("ResBlock", "EfficientViTBlock"), encoder_block_out_channels=(8, 8),
            decoder_block_out_channels=(8, 8), encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
            encoder_layers_per_block=(1, 1), decoder_layers_per_block=[1, 1], downsample_block_type="conv",
            upsample_block_type="interpolate", decoder_norm_types="rms_norm", decoder_act_fns="silu",
            scaling_factor=0.41407).eval()
    with seeded(seed, 3):
        text_encoder = Gemma2Model(Gemma2Config(
            head_dim=16, hidden_size=8, initializer_range=0.02, intermediate_size=64, max_position_embeddings=8192,
            num_attention_heads=2, num_hidden_layers=2, num_key_value_heads=2, vocab_size=len(tok),
            pad_token_id=0)).eval()
    return SanaSprintPipeline(transformer=transformer, vae=vae, scheduler=SCMScheduler(), text_encoder=text_encoder,
                              tokenizer=tok)


GLM_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% elif c['type'] == 'image' %}{{ '<|begin_of_image|><|image|><|end_of_image|>' }}{% endif %}{% endfor %}"
    "{% endif %}{% endfor %}{{ '<|assistant|>\\n' }}")


def _glm_processor():
    """A `GlmImageProcessor` built offline: a byte-level tokenizer with the image-grid tokens it needs."""
    from transformers import GlmImageImageProcessor, GlmImageProcessor, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|user|>", "<|assistant|>", "<sop>", "<eop>", "<|image|>", "<|begin_of_image|>",
                "<|end_of_image|>", "<|dit_token_16384|>"]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=_byte_bpe(specials), pad_token="<|endoftext|>", eos_token="<|endoftext|>",
        bos_token="<|dit_token_16384|>",
        extra_special_tokens={"image_token": "<|image|>", "grid_bos_token": "<sop>", "grid_eos_token": "<eop>"})
    tok.add_special_tokens({"additional_special_tokens": specials[1:]})
    return GlmImageProcessor(image_processor=GlmImageImageProcessor(), tokenizer=tok, chat_template=GLM_TEMPLATE)


def make_glm_image_pipeline(seed: int):
    """GLM-Image: a GLM vision-language model writes image tokens that condition the DiT; a T5 glyph encoder."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, GlmImagePipeline, GlmImageTransformer2DModel
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration

    tok, text_encoder = _t5(seed, 1, d_model=32)
    with seeded(seed, 2):
        vision_language_encoder = GlmImageForConditionalGeneration(GlmImageConfig(
            text_config={"vocab_size": 168064, "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 2,
                         "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 512,
                         "vision_vocab_size": 128, "rope_parameters": {"mrope_section": (4, 2, 2)}},
            vision_config={"depth": 2, "hidden_size": 32, "num_heads": 2, "image_size": 32, "patch_size": 8,
                           "intermediate_size": 32},
            vq_config={"embed_dim": 32, "num_embeddings": 128, "latent_channels": 32})).eval()
    with seeded(seed, 3):
        transformer = GlmImageTransformer2DModel(
            patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
            text_embed_dim=text_encoder.config.hidden_size, time_embed_dim=16, condition_dim=8,
            prior_vq_quantizer_codebook_size=128).eval()
    with seeded(seed, 4):
        vae = AutoencoderKL(block_out_channels=(4, 8, 16, 16), in_channels=3, out_channels=3,
                            down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                            latent_channels=4, norm_num_groups=4, sample_size=128, latents_mean=[0.0] * 4,
                            latents_std=[1.0] * 4).eval()
    return GlmImagePipeline(tokenizer=tok, processor=_glm_processor(), text_encoder=text_encoder,
                            vision_language_encoder=vision_language_encoder, vae=vae, transformer=transformer,
                            scheduler=FlowMatchEulerDiscreteScheduler())


def glm_hub_layout(path: Path) -> None:
    """zai-org/GLM-Image names its processor and prior `["transformers", ...]`; diffusers' `save_pretrained`
    writes `["glm_image", ...]` (transformers' module folder has the pipeline package's name)."""
    index_path = path / "model_index.json"
    index = json.loads(index_path.read_text())
    for name in ("processor", "vision_language_encoder"):
        index[name] = ["transformers", index[name][1]]
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def make_motif_video_pipeline(seed: int):
    """Motif-Video text-to-video: a T5Gemma 2 encoder, a DiT with `transformer_blocks` and
    `single_transformer_blocks`, the Wan VAE, an adaptive-projected guider."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, MotifVideoPipeline
    from diffusers.guiders import AdaptiveProjectedGuidance
    from diffusers.models.transformers.transformer_motif_video import MotifVideoTransformer3DModel
    from transformers import T5Gemma2Encoder, T5Gemma2EncoderConfig, T5Gemma2TextConfig

    tok = build_t5_tokenizer()
    with seeded(seed, 1):
        vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True]).eval()
    with seeded(seed, 2):
        text_encoder = T5Gemma2Encoder(T5Gemma2EncoderConfig(
            text_config=T5Gemma2TextConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           intermediate_size=64, vocab_size=1104, max_position_embeddings=128,
                                           head_dim=16, num_key_value_heads=2, dropout_rate=0.0),
            vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                           "num_attention_heads": 2, "image_size": 32, "patch_size": 8})).eval()
    with seeded(seed, 3):
        transformer = MotifVideoTransformer3DModel(
            in_channels=33, out_channels=16, num_attention_heads=2, attention_head_dim=12, num_layers=2,
            num_single_layers=2, mlp_ratio=4.0, patch_size=1, patch_size_t=1, qk_norm="rms_norm", text_embed_dim=32,
            rope_axes_dim=(4, 4, 4)).eval()
    return MotifVideoPipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
                              text_encoder=text_encoder, tokenizer=tok, feature_extractor=None,
                              guider=AdaptiveProjectedGuidance())


def make_ideogram4_pipeline(seed: int):
    """Ideogram 4: two DiTs (`transformer`, `unconditional_transformer`) and a Qwen3-VL encoder the pipeline
    runs layer by layer itself (its embedding and each decoder layer, never the model's forward)."""
    import torch
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Ideogram4Pipeline,
        Ideogram4Transformer2DModel,
    )
    from diffusers.pipelines.ideogram4.pipeline_ideogram4 import QWEN3_VL_ACTIVATION_LAYERS
    from tiny_families_qwen import byte_qwen_vl_tokenizer
    from transformers import Qwen3VLConfig, Qwen3VLModel

    hidden = 8
    dit = {"in_channels": 16, "num_layers": 2, "attention_head_dim": 8, "num_attention_heads": 4,
           "intermediate_size": 32, "adaln_dim": 16, "llm_features_dim": len(QWEN3_VL_ACTIVATION_LAYERS) * hidden,
           "rope_theta": 10_000, "mrope_section": (2, 1, 1), "norm_eps": 1e-5}
    with seeded(seed, 1):
        transformer = Ideogram4Transformer2DModel(**dit).eval()
    with seeded(seed, 2):
        unconditional = Ideogram4Transformer2DModel(**dit).eval()
    with seeded(seed, 3):
        vae = AutoencoderKLFlux2(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
                                 up_block_types=("UpDecoderBlock2D",), block_out_channels=(8,), layers_per_block=1,
                                 latent_channels=4, norm_num_groups=1, sample_size=32, patch_size=(2, 2),
                                 use_quant_conv=False, use_post_quant_conv=False).eval()
        with torch.no_grad():  # batch-norm statistics that matter
            vae.bn.running_mean.uniform_(-0.1, 0.1)
            vae.bn.running_var.uniform_(0.5, 1.5)
    tok = byte_qwen_vl_tokenizer()
    with seeded(seed, 4):
        text_encoder = Qwen3VLModel(Qwen3VLConfig(
            text_config={"hidden_size": hidden, "num_hidden_layers": max(QWEN3_VL_ACTIVATION_LAYERS) + 1,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 16, "head_dim": 8,
                         "vocab_size": len(tok), "max_position_embeddings": 256, "rope_theta": 10_000.0},
            vision_config={"hidden_size": 8, "depth": 2, "num_heads": 2, "intermediate_size": 16,
                           "out_hidden_size": hidden, "patch_size": 14})).eval()
    return Ideogram4Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                             tokenizer=tok, transformer=transformer, unconditional_transformer=unconditional)


def make_sana_wm_pipeline(seed: int):
    """SANA-WM camera-controlled image-to-video: a Gemma 2 encoder, a DiT whose blocks hold a persistent
    buffer (`attn.recall_gate`), the LTX-2 VAE; it returns one video's frames, unbatched."""
    import torch
    from diffusers import (
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        SanaWMPipeline,
        SanaWMTransformer3DModel,
    )
    from transformers import Gemma2Config, Gemma2Model

    tok = build_t5_tokenizer()
    with seeded(seed, 1):
        text_encoder = Gemma2Model(Gemma2Config(
            head_dim=16, hidden_size=8, intermediate_size=64, max_position_embeddings=512, num_attention_heads=2,
            num_hidden_layers=2, num_key_value_heads=2, vocab_size=len(tok), pad_token_id=0)).eval()
    with seeded(seed, 2):
        transformer = SanaWMTransformer3DModel(
            in_channels=4, num_layers=2, hidden_size=32, num_attention_heads=2, softmax_every_n=2, linear_head_dim=16,
            chunk_plucker_post_attn_blocks=2, chunk_plucker_channels=12, image_size=32, caption_channels=8,
            mlp_ratio=2.0, mixed_precision="fp32").eval()
        with torch.no_grad():  # zero-initialised projections, made to matter
            for parameter in transformer.parameters():
                if parameter.abs().sum() == 0:
                    parameter.normal_(0, 0.05)
    with seeded(seed, 3):
        vae = AutoencoderKLLTX2Video(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,), decoder_block_out_channels=(8,),
            layers_per_block=(1,), decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,),
            decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False), downsample_type=("spatial",),
            upsample_residual=(False,), upsample_factor=(1,), timestep_conditioning=False, patch_size=1,
            patch_size_t=1, encoder_causal=True, decoder_causal=False).eval()
    return SanaWMPipeline(tokenizer=tok, text_encoder=text_encoder, vae=vae, transformer=transformer,
                          scheduler=FlowMatchEulerDiscreteScheduler())


def make_dit_pipeline(seed: int):
    """DiT (class-conditional ImageNet): no text at all; its call takes `class_labels` and no prompt or size."""
    from diffusers import AutoencoderKL, DDIMScheduler, DiTPipeline, DiTTransformer2DModel

    with seeded(seed, 1):
        transformer = DiTTransformer2DModel(
            sample_size=16, num_layers=2, patch_size=4, attention_head_dim=8, num_attention_heads=2, in_channels=4,
            out_channels=8, attention_bias=True, activation_fn="gelu-approximate", num_embeds_ada_norm=1000,
            norm_type="ada_norm_zero", norm_elementwise_affine=False).eval()
    with seeded(seed, 2):
        vae = AutoencoderKL(block_out_channels=[32, 32], down_block_types=["DownEncoderBlock2D"] * 2,
                            up_block_types=["UpDecoderBlock2D"] * 2, latent_channels=4, norm_num_groups=32,
                            sample_size=32).eval()
    return DiTPipeline(transformer=transformer, vae=vae, scheduler=DDIMScheduler())


def make_ddpm_pipeline(seed: int):
    """DDPM: an unconditional pixel-space UNet2DModel (no text, no VAE) that renders its own sample size."""
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    with seeded(seed, 1):
        unet = UNet2DModel(block_out_channels=(4, 8), layers_per_block=1, norm_num_groups=4, sample_size=8,
                           in_channels=3, out_channels=3, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                           up_block_types=("AttnUpBlock2D", "UpBlock2D")).eval()
    return DDPMPipeline(unet=unet, scheduler=DDPMScheduler())


OTHER_GENERATION: dict[str, dict[str, Any]] = {
    # the byte-level system message alone is ~200 tokens; the encoder's layers 1-3 (diffusers' default 10, 20, 30)
    "flux2": {"height": 16, "width": 16, "num_inference_steps": 2, "max_sequence_length": 256,
              "text_encoder_out_layers": (1, 2, 3)},
    # HiDream scales every request to the area of its default size (128x128 here): asked for as such
    "hidream_image": {"height": 128, "width": 128, "num_inference_steps": 2, "max_sequence_length": 16},
    "omnigen": {"height": 16, "width": 16, "num_inference_steps": 2},
    "cosmos": {"height": 32, "width": 32, "num_inference_steps": 2, "max_sequence_length": 16},
    "cogview3": {"height": 16, "width": 16, "num_inference_steps": 2, "max_sequence_length": 16},
    "sana_sprint": {"height": 32, "width": 32, "num_inference_steps": 2, "max_sequence_length": 16,
                    "use_resolution_binning": False},
    "glm_image": {"height": 32, "width": 32, "num_inference_steps": 2, "max_sequence_length": 16},
    "glm_image_saved": {"height": 32, "width": 32, "num_inference_steps": 2, "max_sequence_length": 16},
    "motif_video": {"height": 16, "width": 16, "num_frames": 9, "num_inference_steps": 2, "max_sequence_length": 16},
    # its default guidance schedule has 48 entries, one per default step: none (the scale applies)
    "ideogram4": {"height": 16, "width": 16, "num_inference_steps": 2, "max_sequence_length": 64,
                  "guidance_schedule": None},
    "sana_wm": {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2, "max_sequence_length": 16,
                "action": "w-8,jw-4", "intrinsics": [16.0, 16.0, 16.0, 16.0]},
}
IMAGE_FAMILIES = frozenset({"sana_wm"})
"""Families whose request carries a conditioning image (`--image`)."""
"""Small call kwargs per family, as diffusers' tests pass them (what the CLI can pass too)."""
_T5_FAST = {"tokenizer": "T5TokenizerFast"}
OTHER_MAKERS: dict[str, tuple[Callable[[int], Any], dict[str, str], Callable[[Path], None] | None]] = {
    "flux2": (make_flux2_pipeline, {}, None),
    "hidream_image": (make_hidream_image_pipeline, {"tokenizer_3": "T5TokenizerFast"}, None),
    "omnigen": (make_omnigen_pipeline, {}, None),
    "cosmos": (make_cosmos_pipeline, _T5_FAST, None),
    "cogview3": (make_cogview3_pipeline, _T5_FAST, None),
    "sana_sprint": (make_sana_sprint_pipeline, _T5_FAST, None),
    "glm_image": (make_glm_image_pipeline, _T5_FAST, glm_hub_layout),
    "glm_image_saved": (make_glm_image_pipeline, _T5_FAST, None),  # as diffusers' save_pretrained names it
    "motif_video": (make_motif_video_pipeline, _T5_FAST, None),
    "ideogram4": (make_ideogram4_pipeline, {}, None),
    "sana_wm": (make_sana_wm_pipeline, _T5_FAST, None),
}
"""family -> (maker, tokenizer classes to save as, a rewrite of the saved directory)."""
