"""Write a diffusers pipeline as a model directory: safetensors only, with per-component control.

Used to write the embedded demo model (`demo_model`), and by the benchmarks and tests to write
checkpoints of other sizes and families.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["VARIANT_DTYPE_NAMES", "save_pipeline", "set_model_index_class"]

VARIANT_DTYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16"}


def __getattr__(name: str) -> object:
    """`VARIANT_DTYPES` built on first use: finding the cached demo (`plan`, the console's start) must not
    import torch, which costs seconds on a small machine."""
    if name == "VARIANT_DTYPES":
        import torch

        return {variant: getattr(torch, dtype) for variant, dtype in VARIANT_DTYPE_NAMES.items()}
    raise AttributeError(name)
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
    import torch

    from .tokenizers_offline import write_clip_slow_files

    out = Path(out)
    if variant is None or keep_default:
        _save_components(pipe, out, variant=None, shard_transformer=shard_transformer, weights_only=False)
    if variant is not None:
        dtype = __getattr__("VARIANT_DTYPES").get(variant)
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
    import torch

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
