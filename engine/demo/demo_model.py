"""The embedded demo model: a tiny random-weight Flux pipeline in diffusers layout, built offline.

``omni-console`` without ``--model`` runs this, and the test suite uses it as a real diffusers
pipeline. It is built from code (no hub, no downloads), deterministic per seed (same seed gives
byte-identical safetensors), a few MB, and written atomically so a half-built folder never exists.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..cache_dir import CACHE_ENV, cache_root
from ..errors import ConfigError
from .build_dir import UnwritableFolder, atomic_build, manifest_mismatch
from .pipeline_save import save_pipeline

__all__ = [
    "DEMO_GENERATION",
    "VERSION",
    "build_demo_model",
    "default_demo_model_path",
    "ensure_demo_model",
    "is_demo_model",
]

VERSION = 2
"""Bump when the demo's architecture, weights or marker change, so cached copies are not reused.

2: the marker became a file manifest (``build_dir``); v1 copies, which cannot be checked, stay unused.
"""


DEMO_GENERATION: dict[str, object] = {
    "height": 64,
    "width": 64,
    "num_inference_steps": 2,
    "guidance_scale": 3.5,
    "max_sequence_length": 32,
}
"""Call kwargs that work for the demo (64 px = 8x8 latent = 4x4 packed tokens per side)."""


def default_demo_model_path(seed: int = 0) -> Path:
    """Versioned so an upgraded builder never reuses an old cached demo."""
    return cache_root() / f"demo-flux-v{VERSION}-seed{seed}"


def is_demo_model(path: Path) -> bool:
    """True for a built demo (or tiny Flux) model: its defaults (64 px, 2 steps) suit it. Other tiny
    families carry markers too, and their pipelines have defaults of their own."""
    from .build_dir import build_info

    info = build_info(Path(path))
    return info is not None and info.get("family") == "flux"


@contextmanager
def seeded(seed: int, component: int) -> Iterator[None]:
    """Seed torch's CPU RNG for one component's init, without leaking the state to the caller.

    Each component gets its own derived seed, so changing one component never shifts another's weights.
    """
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * 1000 + component)
        yield


def tiny_clip_text_config(vocab_size: int, *, hidden: int = 32, projection: int = 32, layers: int = 2):
    """A tiny CLIPTextConfig whose special-token ids match the offline tokenizer."""
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        projection_dim=projection,
        num_hidden_layers=layers,
        num_attention_heads=2,
        max_position_embeddings=77,
        hidden_act="quick_gelu",
        bos_token_id=vocab_size - 2,
        eos_token_id=vocab_size - 1,
        pad_token_id=vocab_size - 1,
    )


def tiny_t5_config(vocab_size: int, *, d_model: int = 32, layers: int = 2, umt5: bool = False):
    """A tiny T5 (or UMT5) encoder config; relative positions, so any sequence length works."""
    from transformers import T5Config, UMT5Config

    cls = UMT5Config if umt5 else T5Config
    return cls(
        vocab_size=vocab_size,
        d_model=d_model,
        d_kv=d_model // 2,
        d_ff=d_model * 2,
        num_layers=layers,
        num_decoder_layers=layers,
        num_heads=2,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",
        dense_act_fn="gelu_new",
        is_encoder_decoder=False,
        use_cache=False,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )


def tiny_vae(*, latent_channels: int, scaling_factor: float, shift_factor: float | None):
    """A tiny 4-level AutoencoderKL: spatial factor 8 like the real SD/Flux VAEs, ~1 MB."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(16, 16, 32, 32),
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=8,
        sample_size=64,
        scaling_factor=scaling_factor,
        shift_factor=shift_factor,
        use_quant_conv=shift_factor is None,
        use_post_quant_conv=shift_factor is None,
    ).eval()


def make_flux_pipeline(seed: int):
    """Construct the tiny Flux pipeline in memory (each component under its own derived seed)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel

    from .tokenizers_offline import build_clip_tokenizer, build_t5_tokenizer

    clip_tok = build_clip_tokenizer()
    t5_tok = build_t5_tokenizer()
    clip_hidden, t5_dim = 32, 32
    with seeded(seed, 1):
        text_encoder = CLIPTextModel(tiny_clip_text_config(len(clip_tok), hidden=clip_hidden)).eval()
    with seeded(seed, 2):
        text_encoder_2 = T5EncoderModel(tiny_t5_config(len(t5_tok), d_model=t5_dim)).eval()
    with seeded(seed, 3):
        transformer = FluxTransformer2DModel(
            patch_size=1,
            in_channels=64,  # 16 latent channels x 2x2 packing
            num_layers=2,
            num_single_layers=4,
            attention_head_dim=16,
            num_attention_heads=4,
            joint_attention_dim=t5_dim,
            pooled_projection_dim=clip_hidden,
            guidance_embeds=True,
            axes_dims_rope=(4, 6, 6),
        ).eval()
    with seeded(seed, 4):
        vae = tiny_vae(latent_channels=16, scaling_factor=0.3611, shift_factor=0.1159)
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    return FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=clip_tok,
        text_encoder_2=text_encoder_2,
        tokenizer_2=t5_tok,
        transformer=transformer,
    )


FLUX_LAYOUT: dict[str, str] = {"tokenizer_2": "T5TokenizerFast"}
"""model_index class names as in black-forest-labs/FLUX.1-dev."""


def build_demo_model(path: Path, *, seed: int = 0) -> Path:
    """Write the tiny Flux demo pipeline to ``path`` (atomically) and return ``path``.

    ``path`` must not exist, be an empty folder (it keeps its mode bits), or hold an earlier build
    whose files match its manifest exactly. Anything else is the operator's data and is never replaced
    (ConfigError, nothing touched): deleting only what we provably wrote is the one safe rule, since a
    folder we once built may since have collected notes or images. See ``build_dir``.
    """
    return _build_demo(Path(path).expanduser(), seed, replace=True)


def _build_demo(path: Path, seed: int, *, replace: bool) -> Path:
    marker: dict[str, str | int | float | bool | None] = {"family": "flux", "version": VERSION, "seed": seed}

    def build(tmp: Path) -> None:
        from ..loading.loader import quiet_libraries

        quiet_libraries()  # no library progress bars: the command prints its own line
        save_pipeline(make_flux_pipeline(seed), tmp, class_names=FLUX_LAYOUT)

    return atomic_build(path, build, marker, replace=replace)


_CACHE_SLOTS = 8
"""The cached demo's folder, then ``-2`` .. ``-8`` beside it when an earlier one holds other files."""


def _cache_label(root: Path) -> str:
    return f"{CACHE_ENV}={root}" if os.environ.get(CACHE_ENV) else f"omni-console cache folder {root}"


def _cache_error(root: Path, reason: str) -> ConfigError:
    fix = f"point {CACHE_ENV} at a folder you can write to, or unset it" if os.environ.get(CACHE_ENV) \
        else f"set {CACHE_ENV} to a folder you can write to"
    return ConfigError(f"{_cache_label(root)}: {reason}; {fix}")


def ensure_demo_model(seed: int = 0) -> Path:
    """The cached demo: reused when its files match its manifest, else built once (atomically).

    The cache folder is ours, but an operator may have put files in it (or edited one), and an older
    omni-console may have left a copy without a manifest. Such a folder is never wiped: it is left as
    it is, a warning names it, and the demo is built into the next free sibling (``NAME-2``, ``NAME-3``
    ...), which later calls then find and reuse. Concurrent builders each build in their own temp
    folder; the first rename wins and the others keep the winner's copy.

    ``OMNI_CONSOLE_CACHE_DIR`` (or the user cache dir) pointing at a file, or at a folder that cannot be
    created or written when a build is needed, raises ConfigError with one line naming it. A complete
    cached copy in a read-only folder is still used.
    """
    root = cache_root()
    if os.path.lexists(root) and not root.is_dir():
        raise _cache_error(root, "is not a folder")
    primary = default_demo_model_path(seed)
    candidates = [primary] + [primary.with_name(f"{primary.name}-{n}") for n in range(2, _CACHE_SLOTS + 1)]
    for path in candidates:
        if not os.path.lexists(path):
            return _build_cached(root, path, seed, skipped=primary if path != primary else None)
        if manifest_mismatch(path, trust_unchanged=True) is None:  # hashes re-read only after a change
            return path
    raise _cache_error(root, f"{primary.name} and its siblings hold files omni-console did not write; "
                             "delete the ones you do not need")


def _build_cached(root: Path, path: Path, seed: int, *, skipped: Path | None) -> Path:
    if skipped is not None:
        logging.getLogger(__name__).warning(
            "omni-console: warning: %s holds files omni-console did not write (left as it is); "
            "using %s for the demo model", skipped, path)
    try:
        return _build_demo(path, seed, replace=False)
    except UnwritableFolder as exc:
        raise _cache_error(root, exc.reason) from None
