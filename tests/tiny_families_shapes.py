"""Tiny random-weight pipelines whose block order or size rules differ from the common case, built offline:
Lumina2 (runs `context_refiner` before `noise_refiner`, the reverse of its `__init__`), Flux Kontext (scales
every request to `max_area`), AuraFlow (a learned position embedding of `pos_embed_max_size` patches in all,
not per side). CogVideoX's fixture lives in `tiny_video_families`.

Same conventions as `tiny_families`: deterministic per seed, safetensors only, written atomically, loadable
by the family's own diffusers pipeline class. Configs follow diffusers' own tests for these pipelines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiny_families import _builder

from omni_console.engine.demo.demo_model import make_flux_pipeline, seeded, tiny_t5_config, tiny_vae

__all__ = ["SHAPE_GENERATION", "build_tiny_auraflow", "build_tiny_flux_kontext", "build_tiny_lumina2"]

SHAPE_GENERATION: dict[str, dict[str, Any]] = {
    "lumina2": {"height": 32, "width": 32, "num_inference_steps": 2, "max_sequence_length": 16},
    # Kontext scales every request to max_area pixels: 64x64 is rendered only with max_area 64*64
    "flux_kontext": {"height": 64, "width": 64, "num_inference_steps": 2, "max_sequence_length": 32,
                     "max_area": 64 * 64},
    "auraflow": {"height": 64, "width": 64, "num_inference_steps": 2, "max_sequence_length": 16},
}
"""Small, fast call kwargs per family."""

LUMINA2_LAYOUT = {"tokenizer": "T5TokenizerFast"}
KONTEXT_LAYOUT = {"tokenizer_2": "T5TokenizerFast"}
AURAFLOW_LAYOUT = {"tokenizer": "T5TokenizerFast"}
AURAFLOW_POS_EMBED = 256  # patches in all: 16 per side, so at most 16 * 2 * 8 = 256 px


def make_lumina2_pipeline(seed: int):
    """Lumina2: a Gemma2 text encoder (T5 tokenizer: no Gemma vocabulary offline), DiT with `noise_refiner`,
    `context_refiner` (run first) and `layers`, 4-channel VAE."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Lumina2Pipeline, Lumina2Transformer2DModel
    from transformers import Gemma2Config, Gemma2Model

    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    tokenizer = build_t5_tokenizer()
    with seeded(seed, 1):
        text_encoder = Gemma2Model(Gemma2Config(
            vocab_size=len(tokenizer), hidden_size=8, intermediate_size=16, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2, head_dim=4, max_position_embeddings=64,
            pad_token_id=0, attn_implementation="eager")).eval()
    with seeded(seed, 2):
        transformer = Lumina2Transformer2DModel(
            sample_size=4, patch_size=2, in_channels=4, hidden_size=8, num_layers=2, num_refiner_layers=2,
            num_attention_heads=1, num_kv_heads=1, multiple_of=16, ffn_dim_multiplier=None, norm_eps=1e-5,
            scaling_factor=1.0, axes_dim_rope=(4, 2, 2), cap_feat_dim=8,
        ).eval()
    with seeded(seed, 3):
        vae = tiny_vae(latent_channels=4, scaling_factor=0.3611, shift_factor=0.1159)
    return Lumina2Pipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(),
                           text_encoder=text_encoder, tokenizer=tokenizer)


def make_flux_kontext_pipeline(seed: int):
    """Flux Kontext: the demo Flux parts under FluxKontextPipeline."""
    from diffusers import FluxKontextPipeline

    parts = make_flux_pipeline(seed).components
    return FluxKontextPipeline(**parts)


def make_auraflow_pipeline(seed: int):
    """AuraFlow: UMT5 encoder, MMDiT (`joint_transformer_blocks`, `single_transformer_blocks`) whose learned
    position embedding holds `pos_embed_max_size` patches in all."""
    from diffusers import AuraFlowPipeline, AuraFlowTransformer2DModel, FlowMatchEulerDiscreteScheduler
    from transformers import UMT5EncoderModel

    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    tokenizer = build_t5_tokenizer()
    with seeded(seed, 1):
        text_encoder = UMT5EncoderModel(tiny_t5_config(len(tokenizer), d_model=32, umt5=True)).eval()
    with seeded(seed, 2):
        transformer = AuraFlowTransformer2DModel(
            sample_size=32, patch_size=2, in_channels=4, num_mmdit_layers=2, num_single_dit_layers=2,
            attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
            out_channels=4, pos_embed_max_size=AURAFLOW_POS_EMBED,
        ).eval()
    with seeded(seed, 3):
        vae = tiny_vae(latent_channels=4, scaling_factor=0.13025, shift_factor=None)
    return AuraFlowPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                            scheduler=FlowMatchEulerDiscreteScheduler())


build_tiny_lumina2 = _builder("lumina2", make_lumina2_pipeline, LUMINA2_LAYOUT,
                              "A tiny Lumina2Pipeline (2 + 2 refiner blocks, 2 layers) at ``path``.")
build_tiny_flux_kontext = _builder("flux_kontext", make_flux_kontext_pipeline, KONTEXT_LAYOUT,
                                   "A tiny FluxKontextPipeline (the demo's Flux parts) at ``path``.")
build_tiny_auraflow = _builder("auraflow", make_auraflow_pipeline, AURAFLOW_LAYOUT,
                               "A tiny AuraFlowPipeline (2 joint + 2 single blocks) at ``path``.")


def build_all(root: Path, seed: int = 0) -> dict[str, Path]:
    """Every fixture of this file under `root` (for a quick look by hand)."""
    return {"lumina2": build_tiny_lumina2(root / "lumina2", seed),
            "flux_kontext": build_tiny_flux_kontext(root / "flux-kontext", seed),
            "auraflow": build_tiny_auraflow(root / "auraflow", seed)}
