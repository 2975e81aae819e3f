"""Tiny random-weight pipelines for other diffusers DiT families, built offline: SD3, PixArt-Sigma, and the
video families Wan, LTX-Video (text-to-video and image-to-video) and CogVideoX.

Same conventions as the demo (``demo_model``): deterministic per seed, safetensors only, written
atomically, and loadable by the family's own diffusers pipeline class. Each builder can also write a
sharded transformer (two shards + index) or a variant (``fp16`` / ``bf16`` hold that dtype; with
``keep_default`` beside the float32 files) so discovery can be tested against hub-like layouts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiny_video_families import make_cogvideox_pipeline, make_ltx_i2v_pipeline, make_ltx_pipeline

from omni_console.engine.demo.build_dir import atomic_build
from omni_console.engine.demo.demo_model import (
    FLUX_LAYOUT,
    make_flux_pipeline,
    seeded,
    tiny_clip_text_config,
    tiny_t5_config,
    tiny_vae,
)
from omni_console.engine.demo.pipeline_save import save_pipeline

__all__ = [
    "FAMILY_GENERATION",
    "build_tiny_cogvideox",
    "build_tiny_flux",
    "build_tiny_ltx",
    "build_tiny_ltx_i2v",
    "build_tiny_pixart_sigma",
    "build_tiny_sd3",
    "build_tiny_wan",
    "write_wide_wan",
]

FAMILY_GENERATION: dict[str, dict[str, Any]] = {
    "flux": {"height": 64, "width": 64, "num_inference_steps": 2, "max_sequence_length": 32},
    "sd3": {"height": 64, "width": 64, "num_inference_steps": 2, "max_sequence_length": 32},
    "pixart_sigma": {
        "height": 64,
        "width": 64,
        "num_inference_steps": 2,
        "max_sequence_length": 32,
        "use_resolution_binning": False,  # binning would render at 256 px and resize
    },
    "wan": {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2, "max_sequence_length": 32},
    "ltx": {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2, "max_sequence_length": 16},
    "ltx_i2v": {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2, "max_sequence_length": 16},
    # the tiny CogVideoX's transformer takes text of exactly 16 tokens (the pipeline's default is 226)
    "cogvideox": {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2, "max_sequence_length": 16},
}
"""Small, fast call kwargs per family (the pipelines' own defaults also work, just slower)."""

# model_index class names as in the upstream diffusers repos.
SD3_LAYOUT = {"tokenizer_3": "T5TokenizerFast"}
PIXART_LAYOUT: dict[str, str] = {}
WAN_LAYOUT = {"tokenizer": "T5TokenizerFast"}
LTX_LAYOUT = {"tokenizer": "T5TokenizerFast"}
COGVIDEOX_LAYOUT = {"tokenizer": "T5TokenizerFast"}


def _write(
    path: Path,
    family: str,
    seed: int,
    make: Callable[[int], Any],
    layout: dict[str, str],
    *,
    shard_transformer: bool,
    variant: str | None,
    keep_default: bool,
) -> Path:
    marker = {
        "family": family,
        "seed": seed,
        "shard_transformer": shard_transformer,
        "variant": variant,
        "keep_default": keep_default,
    }

    def build(tmp: Path) -> None:
        save_pipeline(
            make(seed),
            tmp,
            class_names=layout,
            shard_transformer=shard_transformer,
            variant=variant,
            keep_default=keep_default,
        )

    return atomic_build(Path(path), build, marker)


def _builder(family: str, make: Callable[[int], Any], layout: dict[str, str], doc: str) -> Callable[..., Path]:
    """A ``build_tiny_<family>(path, seed=0, *, shard_transformer, variant, keep_default) -> Path``."""

    def build(
        path: Path,
        seed: int = 0,
        *,
        shard_transformer: bool = False,
        variant: str | None = None,
        keep_default: bool = False,
    ) -> Path:
        return _write(path, family, seed, make, layout, shard_transformer=shard_transformer, variant=variant,
                      keep_default=keep_default)

    build.__name__ = build.__qualname__ = f"build_tiny_{family}"
    build.__doc__ = doc
    return build


build_tiny_flux = _builder(
    "flux", make_flux_pipeline, FLUX_LAYOUT, "The demo Flux pipeline, with the shard / variant layout options."
)


def make_sd3_pipeline(seed: int):
    """SD3: 2 CLIP-with-projection encoders + T5, MMDiT with ``transformer_blocks`` (last is context-only)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection, T5EncoderModel

    from omni_console.engine.demo.tokenizers_offline import build_clip_tokenizer, build_t5_tokenizer

    clip_tok, clip_tok_2, t5_tok = build_clip_tokenizer(), build_clip_tokenizer(), build_t5_tokenizer()
    clip_hidden, clip_proj = 32, 32
    t5_dim = 2 * clip_hidden  # the pipeline pads the concatenated CLIP states up to T5's width
    with seeded(seed, 1):
        text_encoder = CLIPTextModelWithProjection(
            tiny_clip_text_config(len(clip_tok), hidden=clip_hidden, projection=clip_proj)
        ).eval()
    with seeded(seed, 2):
        text_encoder_2 = CLIPTextModelWithProjection(
            tiny_clip_text_config(len(clip_tok_2), hidden=clip_hidden, projection=clip_proj)
        ).eval()
    with seeded(seed, 3):
        text_encoder_3 = T5EncoderModel(tiny_t5_config(len(t5_tok), d_model=t5_dim)).eval()
    with seeded(seed, 4):
        transformer = SD3Transformer2DModel(
            sample_size=8,
            patch_size=2,
            in_channels=16,
            out_channels=16,
            num_layers=3,
            attention_head_dim=16,
            num_attention_heads=4,
            joint_attention_dim=t5_dim,
            caption_projection_dim=64,
            pooled_projection_dim=2 * clip_proj,
            pos_embed_max_size=16,
        ).eval()
    with seeded(seed, 5):
        vae = tiny_vae(latent_channels=16, scaling_factor=1.5305, shift_factor=0.0609)
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=clip_tok,
        text_encoder_2=text_encoder_2,
        tokenizer_2=clip_tok_2,
        text_encoder_3=text_encoder_3,
        tokenizer_3=t5_tok,
    )


build_tiny_sd3 = _builder(
    "sd3", make_sd3_pipeline, SD3_LAYOUT, "A tiny StableDiffusion3Pipeline (3 DiT blocks) at ``path``."
)


def make_pixart_sigma_pipeline(seed: int):
    """PixArt-Sigma: one T5 encoder, DiT with ``transformer_blocks``, 4-channel VAE, DPM-Solver++."""
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel
    from transformers import T5EncoderModel

    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    t5_tok = build_t5_tokenizer(model_max_length=300)
    t5_dim = 32
    with seeded(seed, 1):
        text_encoder = T5EncoderModel(tiny_t5_config(len(t5_tok), d_model=t5_dim)).eval()
    with seeded(seed, 2):
        transformer = PixArtTransformer2DModel(
            sample_size=32,  # a size PixArt's resolution binning knows (the 256 px bins)
            num_layers=4,
            patch_size=2,
            attention_head_dim=16,
            num_attention_heads=4,
            in_channels=4,
            out_channels=8,  # learned sigma, as upstream
            cross_attention_dim=64,
            caption_channels=t5_dim,
            attention_bias=True,
            activation_fn="gelu-approximate",
            num_embeds_ada_norm=1000,
            norm_type="ada_norm_single",
            norm_elementwise_affine=False,
            norm_eps=1e-6,
            interpolation_scale=None,
        ).eval()
    with seeded(seed, 3):
        vae = tiny_vae(latent_channels=4, scaling_factor=0.13025, shift_factor=None)
    scheduler = DPMSolverMultistepScheduler(
        num_train_timesteps=1000,
        beta_start=0.0001,
        beta_end=0.02,
        beta_schedule="linear",
        solver_order=2,
        prediction_type="epsilon",
        algorithm_type="dpmsolver++",
        lower_order_final=True,
    )
    return PixArtSigmaPipeline(
        tokenizer=t5_tok, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler
    )


build_tiny_pixart_sigma = _builder(
    "pixart_sigma", make_pixart_sigma_pipeline, PIXART_LAYOUT, "A tiny PixArtSigmaPipeline (4 DiT blocks) at ``path``."
)


def make_wan_pipeline(seed: int):
    """Wan 2.1: UMT5 encoder, video DiT with ``blocks``, causal 3D VAE, UniPC with flow shift."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5EncoderModel

    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    t5_tok = build_t5_tokenizer()
    t5_dim = 32
    with seeded(seed, 1):
        text_encoder = UMT5EncoderModel(tiny_t5_config(len(t5_tok), d_model=t5_dim, umt5=True)).eval()
    with seeded(seed, 2):
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=4,
            attention_head_dim=16,
            in_channels=16,
            out_channels=16,
            text_dim=t5_dim,
            freq_dim=32,
            ffn_dim=128,
            num_layers=3,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32,
        ).eval()
    with seeded(seed, 3):
        vae = AutoencoderKLWan(
            base_dim=8,
            z_dim=16,
            dim_mult=[1, 1, 1, 1],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
        ).eval()
    scheduler = UniPCMultistepScheduler(
        num_train_timesteps=1000,
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        flow_shift=3.0,
        solver_order=2,
    )
    return WanPipeline(
        tokenizer=t5_tok, text_encoder=text_encoder, vae=vae, scheduler=scheduler, transformer=transformer
    )


build_tiny_wan = _builder(
    "wan", make_wan_pipeline, WAN_LAYOUT, "A tiny WanPipeline (text-to-video, 3 DiT blocks) at ``path``."
)


def write_wide_wan(path: Path, d_ff: int | None = None) -> Path:
    """The tiny Wan pipeline at `path` with a 6-layer UMT5, more layers than a layer ring's 2 slots, so it streams
    layer by layer (`d_ff`: wider feed-forwards, so that its layers are most of its bytes)."""
    import torch
    from transformers import UMT5EncoderModel

    pipe = make_wan_pipeline(0)
    torch.manual_seed(5)
    config = tiny_t5_config(len(pipe.tokenizer), layers=6, umt5=True)
    if d_ff is not None:
        config.d_ff = d_ff
    pipe.text_encoder = UMT5EncoderModel(config).eval()
    save_pipeline(pipe, path, class_names=WAN_LAYOUT, shard_transformer=False, variant=None, keep_default=False)
    return path


build_tiny_ltx = _builder(
    "ltx", make_ltx_pipeline, LTX_LAYOUT, "A tiny LTXPipeline (text-to-video, 3 DiT blocks) at ``path``."
)
build_tiny_ltx_i2v = _builder(
    "ltx_i2v", make_ltx_i2v_pipeline, LTX_LAYOUT,
    "A tiny LTXImageToVideoPipeline (image-to-video, 3 DiT blocks) at ``path``.",
)
build_tiny_cogvideox = _builder(
    "cogvideox", make_cogvideox_pipeline, COGVIDEOX_LAYOUT, "A tiny CogVideoXPipeline (3 DiT blocks) at ``path``."
)
