"""The embedded demo model: a tiny random-weight Flux pipeline in diffusers layout, built offline.

``omni-console`` without ``--model`` runs this, and the test suite uses it as a real diffusers
pipeline. It is built from code (no hub, no downloads), deterministic per seed (same seed gives
byte-identical safetensors), a few MB, and written atomically so a half-built folder never exists.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

__all__ = [
    "CACHE_ENV",
    "COMPLETE_MARKER",
    "DEMO_GENERATION",
    "VARIANT_DTYPES",
    "VERSION",
    "atomic_build",
    "build_demo_model",
    "cache_root",
    "default_demo_model_path",
    "ensure_demo_model",
    "FLUX_LAYOUT",
    "is_complete",
    "make_flux_pipeline",
    "save_pipeline",
    "seeded",
    "set_model_index_class",
    "tiny_vae",
    "tiny_clip_text_config",
    "tiny_t5_config",
]

VERSION = 1
"""Bump when the demo's architecture or weights change, so cached copies are not reused."""

CACHE_ENV = "OMNI_CONSOLE_CACHE_DIR"
COMPLETE_MARKER = ".omni-console-complete.json"

DEMO_GENERATION: dict[str, object] = {
    "height": 64,
    "width": 64,
    "num_inference_steps": 2,
    "guidance_scale": 3.5,
    "max_sequence_length": 32,
}
"""Call kwargs that work for the demo (64 px = 8x8 latent = 4x4 packed tokens per side)."""


def cache_root() -> Path:
    """Root of omni-console's cache: ``$OMNI_CONSOLE_CACHE_DIR`` or the platform user cache dir."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("omni-console", appauthor=False))


def default_demo_model_path(seed: int = 0) -> Path:
    """Versioned so an upgraded builder never reuses an old cached demo."""
    return cache_root() / f"demo-flux-v{VERSION}-seed{seed}"


def is_complete(path: Path) -> bool:
    """True when ``path`` was fully built (the marker is written last, before the atomic rename)."""
    return (Path(path) / COMPLETE_MARKER).is_file()


@contextmanager
def seeded(seed: int, component: int) -> Iterator[None]:
    """Seed torch's CPU RNG for one component's init, without leaking the state to the caller.

    Each component gets its own derived seed, so changing one component never shifts another's weights.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * 1000 + component)
        yield


def atomic_build(path: Path, build: Callable[[Path], None], marker: dict[str, object], *, replace: bool = True) -> Path:
    """Run ``build(tmp)`` in a temp dir beside ``path``, mark it complete, then rename into place.

    Readers never see a half-built folder. An incomplete leftover at ``path`` is always replaced; a
    complete one is replaced only with ``replace`` (otherwise, e.g. when a concurrent builder won the
    race, our copy is discarded and theirs kept).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    old: Path | None = None
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes 0700; a cache dir should look like any other
        build(tmp)
        (tmp / COMPLETE_MARKER).write_text(json.dumps(marker, sort_keys=True) + "\n")
        if path.exists() and (replace or not is_complete(path)):
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.rename(path, old / "x")
        try:
            os.rename(tmp, path)
        except OSError:
            if not is_complete(path):
                raise
    finally:
        for leftover in (tmp, old):
            if leftover is not None and leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    return path


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


VARIANT_DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "bf16": torch.bfloat16}
"""Variants whose files hold that dtype, as on the hub; any other variant name keeps float32."""


def save_pipeline(
    pipe,
    out: Path,
    *,
    class_names: dict[str, str] | None = None,
    shard_transformer: bool = False,
    variant: str | None = None,
    keep_default: bool = False,
) -> None:
    """Save a pipeline safetensors-only, like ``DiffusionPipeline.save_pretrained`` but with per-component
    control: the transformer alone can be sharded (into two shards), and a variant can be written alone or
    beside the default float32 files (``keep_default``), as hub repos do.
    """
    from .tokenizers_offline import write_clip_slow_files

    out = Path(out)
    if variant is None or keep_default:
        _save_components(pipe, out, variant=None, shard_transformer=shard_transformer, weights_only=False)
    if variant is not None:
        dtype = VARIANT_DTYPES.get(variant)
        if dtype is not None:
            for component in pipe.components.values():
                if isinstance(component, torch.nn.Module):
                    torch.nn.Module.to(component, dtype)  # plain cast; skips diffusers' fp32-modules warning
        _save_components(pipe, out, variant=variant, shard_transformer=shard_transformer, weights_only=keep_default)
    pipe.save_config(str(out))  # model_index.json
    for name, component in pipe.components.items():
        if type(component).__name__ == "CLIPTokenizer":
            write_clip_slow_files(out / name)
    for name, class_name in (class_names or {}).items():
        set_model_index_class(out, name, class_name)


def _two_shard_limit(module: torch.nn.Module) -> int:
    """A max_shard_size that splits ``module`` into exactly two shards (greedy packing)."""
    sizes = [t.numel() * t.element_size() for t in module.state_dict().values()]
    return sum(sizes) // 2 + max(sizes)


def _save_components(pipe, out: Path, *, variant: str | None, shard_transformer: bool, weights_only: bool) -> None:
    """Save each component into ``out/<name>``; ``weights_only`` keeps existing configs untouched."""
    for name, component in pipe.components.items():
        is_model = isinstance(component, torch.nn.Module)
        if component is None or not hasattr(component, "save_pretrained") or (weights_only and not is_model):
            continue
        folder = out / name
        params = inspect.signature(component.save_pretrained).parameters
        kwargs: dict[str, object] = {}
        if "safe_serialization" in params:
            kwargs["safe_serialization"] = True
        if "variant" in params:
            kwargs["variant"] = variant
        if is_model and "max_shard_size" in params:
            split = shard_transformer and name == "transformer"
            kwargs["max_shard_size"] = _two_shard_limit(component) if split else "10GB"
        kept = {}
        if weights_only and folder.is_dir():
            kept = {p: p.read_bytes() for p in folder.glob("*.json") if ".index." not in p.name}
        component.save_pretrained(str(folder), **kwargs)
        for config_path, data in kept.items():
            config_path.write_bytes(data)


def set_model_index_class(root: Path, component: str, class_name: str) -> None:
    """Name a component's class as the upstream repos do (transformers 5 aliases the Fast names)."""
    index_path = Path(root) / "model_index.json"
    index = json.loads(index_path.read_text())
    index[component] = [index[component][0], class_name]
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def build_demo_model(path: Path, *, seed: int = 0) -> Path:
    """Write the tiny Flux demo pipeline to ``path`` (atomically) and return ``path``.

    ``path`` must not exist, be an empty folder, or hold an earlier demo build: anything else is
    the operator's data and is never replaced (ConfigError, nothing touched).
    """
    from ..offload.errors import ConfigError

    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path}: is a file; give a new folder for the demo model")
    if path.is_dir() and any(path.iterdir()) and not is_complete(path):
        raise ConfigError(f"{path}: folder is not empty and is not an omni-console demo model; "
                          "give a new or empty folder (nothing was changed)")
    return _build_demo(path, seed, replace=True)


def _build_demo(path: Path, seed: int, *, replace: bool) -> Path:
    marker = {"family": "flux", "version": VERSION, "seed": seed}

    def build(tmp: Path) -> None:
        from .loader import quiet_libraries

        quiet_libraries()  # no library progress bars: the command prints its own line
        save_pipeline(make_flux_pipeline(seed), tmp, class_names=FLUX_LAYOUT)

    return atomic_build(path, build, marker, replace=replace)


def ensure_demo_model(seed: int = 0) -> Path:
    """Build the cached demo once; later calls (and concurrent winners) reuse the complete copy."""
    path = default_demo_model_path(seed)
    if is_complete(path):
        return path
    return _build_demo(path, seed, replace=False)
