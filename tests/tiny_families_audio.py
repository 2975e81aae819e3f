"""A tiny ACE-Step pipeline (text and lyrics to music: a Qwen3 encoder, a 1-D DiT with `layers`, the Oobleck
audio VAE), built as diffusers' tests/pipelines/ace_step test builds it, with a byte-level tokenizer offline.
It returns `audios` only: `run` writes them as a .wav or .flac (engine/running/audio_track.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiny_families_new import _byte_qwen_tokenizer

from omni_console.engine.demo.demo_model import atomic_build, save_pipeline, seeded

ACE_STEP_CALL: dict[str, Any] = {"lyrics": "[verse]\nSoft notes in the morning", "audio_duration": 8.0,
                                 "max_text_length": 32}
"""What diffusers' test passes besides the prompt (`audio_duration` in seconds; the VAE runs at 4 Hz here)."""


def make_ace_step_pipeline(seed: int):
    from diffusers import AutoencoderOobleck, FlowMatchEulerDiscreteScheduler
    from diffusers.models.transformers.ace_step_transformer import AceStepTransformer1DModel
    from diffusers.pipelines.ace_step import (
        AceStepAudioTokenDetokenizer,
        AceStepAudioTokenizer,
        AceStepConditionEncoder,
        AceStepPipeline,
    )
    from transformers import Qwen3Config, Qwen3Model

    common = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "rope_theta": 10000.0,
              "sliding_window": 16}
    with seeded(seed, 1):
        transformer = AceStepTransformer1DModel(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                in_channels=24, audio_acoustic_hidden_dim=8, patch_size=2,
                                                **common).eval()
    tok = _byte_qwen_tokenizer()
    with seeded(seed, 2):
        text_encoder = Qwen3Model(Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                              vocab_size=len(tok), max_position_embeddings=256)).eval()
    with seeded(seed, 3):
        condition_encoder = AceStepConditionEncoder(
            hidden_size=32, intermediate_size=64, text_hidden_dim=32, timbre_hidden_dim=8,
            num_lyric_encoder_hidden_layers=2, num_timbre_encoder_hidden_layers=2, **common).eval()
    with seeded(seed, 4):
        audio_tokenizer = AceStepAudioTokenizer(
            hidden_size=32, intermediate_size=64, audio_acoustic_hidden_dim=8, pool_window_size=2, fsq_dim=32,
            fsq_input_levels=[4, 4, 4], fsq_input_num_quantizers=1, num_attention_pooler_hidden_layers=1,
            **common).eval()
    with seeded(seed, 5):
        detokenizer = AceStepAudioTokenDetokenizer(
            hidden_size=32, intermediate_size=64, audio_acoustic_hidden_dim=8, pool_window_size=2,
            num_attention_pooler_hidden_layers=1, **common).eval()
    with seeded(seed, 6):
        vae = AutoencoderOobleck(encoder_hidden_size=6, downsampling_ratios=[1, 2], decoder_channels=3,
                                 decoder_input_channels=8, audio_channels=2, channel_multiples=[2, 4],
                                 sampling_rate=4).eval()
    return AceStepPipeline(transformer=transformer, condition_encoder=condition_encoder, vae=vae,
                           text_encoder=text_encoder, tokenizer=tok,
                           scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1, shift=1.0),
                           audio_tokenizer=audio_tokenizer, audio_token_detokenizer=detokenizer)


def build_tiny_ace_step(path: Path, seed: int = 0) -> Path:
    """Write the tiny ACE-Step pipeline to `path` (atomically; an identical earlier build is kept)."""
    return atomic_build(Path(path), lambda tmp: save_pipeline(make_ace_step_pipeline(seed), tmp),
                        {"family": "ace_step", "seed": seed})
