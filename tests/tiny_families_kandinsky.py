"""Tiny Kandinsky 5 T2I, as diffusers' own fast test builds it (tests/pipelines/kandinsky5/
test_kandinsky5_t2i.py `get_dummy_components`): a Qwen2.5-VL text encoder with its Qwen2-VL processor, a
CLIP text model, `AutoencoderKL(mid_block_add_attention=False)` and a two-block Kandinsky 5 transformer.

The test downloads its processor (hf-internal-testing/tiny-random-Qwen2VLForConditionalGeneration) and
CLIP tokenizer; here both are built offline: a byte-level Qwen2 tokenizer with the special tokens the
prompt template and the processor use, Qwen2-VL's image and video processors at their defaults, and the
demo's CLIP tokenizer (`tokenizers_offline`).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from omni_console.engine.demo.demo_model import atomic_build, save_pipeline, seeded
from omni_console.engine.demo.tokenizers_offline import build_clip_tokenizer

QWEN_HIDDEN = 32
CLIP_HIDDEN = 16
# Kandinsky 5 T2I renders only its listed sizes (`self.resolutions`); diffusers' test sets that list to
# [(64, 64)] on the pipeline object, which a saved model cannot carry, so the smallest listed one is used:
# 1024x1024, which the pipeline's fixed VAE factor of 8 makes a 128x128 latent (4,096 visual tokens after
# the 2x2 patches), and the test's VAE (one upsampling) decodes to 256x256 pixels.
KANDINSKY5_GENERATION = {"height": 1024, "width": 1024, "num_inference_steps": 2, "max_sequence_length": 256}


QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>")


def save_qwen_processor(folder: Path) -> None:
    """A Qwen2-VL processor's files over a byte-level tokenizer (every character of the prompt template is a
    token): the tokenizer's, the image processor's, and the video processor's where torchvision is installed
    (transformers builds Qwen2-VL's video processor only with it). Written file by file: transformers will
    not build the processor object itself without its video processor."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import Qwen2Tokenizer, Qwen2VLImageProcessor

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    for special in QWEN_SPECIALS:
        vocab[special] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIALS[1:])})
    tokenizer.save_pretrained(str(folder))
    Qwen2VLImageProcessor().save_pretrained(str(folder))
    if importlib.util.find_spec("torchvision") is not None:
        from transformers import Qwen2VLVideoProcessor

        Qwen2VLVideoProcessor().save_pretrained(str(folder))


def make_kandinsky5_t2i_pipeline(seed: int):
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        Kandinsky5T2IPipeline,
        Kandinsky5Transformer3DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    with seeded(seed, 1):
        vae = AutoencoderKL(
            act_fn="silu", block_out_channels=[32, 64], down_block_types=["DownEncoderBlock2D"] * 2,
            force_upcast=True, in_channels=3, latent_channels=16, layers_per_block=1, mid_block_add_attention=False,
            norm_num_groups=32, out_channels=3, sample_size=128, scaling_factor=0.3611, shift_factor=0.1159,
            up_block_types=["UpDecoderBlock2D"] * 2, use_post_quant_conv=False, use_quant_conv=False).eval()
    with seeded(seed, 2):
        text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
            text_config={"hidden_size": QWEN_HIDDEN, "intermediate_size": QWEN_HIDDEN, "num_hidden_layers": 2,
                         "num_attention_heads": 2, "num_key_value_heads": 2, "rope_theta": 1000000.0,
                         "rope_scaling": {"mrope_section": [2, 2, 4], "rope_type": "default", "type": "default"}},
            vision_config={"depth": 2, "hidden_size": QWEN_HIDDEN, "intermediate_size": QWEN_HIDDEN, "num_heads": 2,
                           "out_hidden_size": QWEN_HIDDEN},
            hidden_size=QWEN_HIDDEN, vocab_size=152064, vision_end_token_id=151653, vision_start_token_id=151652,
            vision_token_id=151654)).eval()
    with seeded(seed, 3):
        text_encoder_2 = CLIPTextModel(CLIPTextConfig(
            bos_token_id=0, eos_token_id=2, hidden_size=CLIP_HIDDEN, intermediate_size=16, layer_norm_eps=1e-05,
            num_attention_heads=2, num_hidden_layers=2, pad_token_id=1, vocab_size=1000,
            projection_dim=CLIP_HIDDEN)).eval()
    with seeded(seed, 4):
        transformer = Kandinsky5Transformer3DModel(
            in_visual_dim=16, in_text_dim=QWEN_HIDDEN, in_text_dim2=CLIP_HIDDEN, time_dim=16, out_visual_dim=16,
            patch_size=(1, 2, 2), model_dim=16, ff_dim=32, num_text_blocks=1, num_visual_blocks=2,
            axes_dims=(1, 1, 2), visual_cond=False, attention_type="regular").eval()
    return Kandinsky5T2IPipeline(
        transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=None,
        text_encoder_2=text_encoder_2, tokenizer_2=build_clip_tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))


def build_tiny_kandinsky5_t2i(path: Path, seed: int = 0) -> Path:
    """Write the tiny Kandinsky 5 T2I to `path` (atomically; an identical earlier build is kept)."""

    def build(tmp: Path) -> None:
        save_pipeline(make_kandinsky5_t2i_pipeline(seed), tmp)  # the processor is written on its own:
        save_qwen_processor(tmp / "tokenizer")
        index = json.loads((tmp / "model_index.json").read_text())
        index["tokenizer"] = ["transformers", "Qwen2VLProcessor"]
        (tmp / "model_index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

    return atomic_build(Path(path), build, {"family": "kandinsky5_t2i", "seed": seed})
