"""A tiny random-weight Wan 2.2 A14B pipeline: two experts (`transformer` high-noise, `transformer_2`
low-noise) of 3 blocks each, switched by diffusers at `boundary_ratio` * 1000 = 875, as the real one.

Same conventions as ``tiny_families`` (deterministic per seed, safetensors only, written atomically).
The two experts are built under different seeds, so an output that ran the wrong expert differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiny_families import WAN_LAYOUT, _write

from omni_console.engine.demo.demo_model import seeded

BOUNDARY_RATIO = 0.875  # Wan2.2-T2V-A14B's model_index.json
EXPERTS_GENERATION: dict[str, Any] = {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 4,
                                      "max_sequence_length": 32}
"""Four steps: with the flow shift of 3, two run above the boundary (transformer) and two below."""


def _wan_expert(seed: int, stream: int):
    from diffusers import WanTransformer3DModel

    with seeded(seed, stream):
        return WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16, in_channels=16, out_channels=16,
            text_dim=32, freq_dim=32, ffn_dim=128, num_layers=3, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
        ).eval()


def make_wan22_a14b_pipeline(seed: int):
    """WanPipeline with both experts and `boundary_ratio` set (saved into model_index.json)."""
    from tiny_families import make_wan_pipeline

    wan = make_wan_pipeline(seed)  # the UMT5 encoder, Wan VAE, UniPC with flow shift 3
    from diffusers import WanPipeline

    return WanPipeline(tokenizer=wan.tokenizer, text_encoder=wan.text_encoder, vae=wan.vae, scheduler=wan.scheduler,
                       transformer=_wan_expert(seed, 2), transformer_2=_wan_expert(seed, 4),
                       boundary_ratio=BOUNDARY_RATIO)


def build_tiny_wan22_a14b(path: Path, seed: int = 0) -> Path:
    """A tiny Wan 2.2 A14B (two experts, boundary 0.875) at ``path``."""
    return _write(path, "wan22_a14b", seed, make_wan22_a14b_pipeline, WAN_LAYOUT, shard_transformer=False,
                  variant=None, keep_default=False)
