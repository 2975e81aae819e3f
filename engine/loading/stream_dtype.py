"""Which DiT weights are stored in fp8, by diffusers' layerwise-casting rule, and casting them at load.

The rule is diffusers' own (`ModelMixin.enable_layerwise_casting` with its default patterns, read from
the installed package): leaf layers of the types it casts (Linear, Conv*, Embedding) are stored in
fp8, except those whose qualified name matches `DEFAULT_SKIP_MODULES_PATTERN` (`pos_embed`,
`patch_embed`, `norm`, `^proj_in$`, `^proj_out$`), the class's `_keep_in_fp32_modules` or its
`_skip_layerwise_casting_patterns`. Everything else keeps the compute dtype. So outputs are
bit-identical to diffusers' layerwise casting with the same storage and compute dtypes, and differ
from the plain pipeline's by the fp8 rounding of those weights.

`modulation=True` (opt-in, *not* diffusers' rule) also stores the AdaLN modulation linears (leaf
layers inside `AdaLayerNorm*` modules, which the `norm` pattern skips) in fp8, as common fp8
checkpoints do; a resident model cast with the same selection (`apply_storage_hooks`) is the reference.

A tensor still in its file (`offload.deferred_weights`) is re-typed before it is read, so it lands
in the arena already 8-bit: no full-precision copy is made on the way.
"""

from __future__ import annotations

import re

import torch

from ...offload.deferred_weights import DeferredWeights
from ...offload.devices import rebind
from ..model_dir.fp8_names import (  # noqa: F401
    DEMO_DIFFERENCE,
    FP8_NAMES,
    SKIP_PATTERNS,
    fp8_block_bytes,
    header_stored_fp8,
    storage_note,
)

STREAM_DTYPES: dict[str, torch.dtype] = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
assert tuple(STREAM_DTYPES) == FP8_NAMES  # the names plan.py reads without torch


def _layer_types() -> tuple[type[torch.nn.Module], ...]:
    try:
        from diffusers.hooks._common import _GO_LC_SUPPORTED_PYTORCH_LAYERS as layers
        return tuple(layers)
    except ImportError:  # older diffusers: the types its layerwise casting has always covered
        return (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d,
                torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d, torch.nn.Linear)


def default_patterns() -> tuple[str, ...]:
    try:
        from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN
        return tuple(DEFAULT_SKIP_MODULES_PATTERN)
    except ImportError:
        return SKIP_PATTERNS


def skip_patterns(model: torch.nn.Module) -> tuple[str, ...]:
    """The patterns `enable_layerwise_casting` skips for this model's class."""
    patterns = default_patterns()
    patterns += tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    patterns += tuple(getattr(model, "_skip_layerwise_casting_patterns", None) or ())
    return tuple(dict.fromkeys(patterns))


def storage_leaves(model: torch.nn.Module, *, modulation: bool = False) -> list[tuple[str, torch.nn.Module]]:
    """(qualified name, leaf layer) for every layer stored in fp8, walked as diffusers walks them."""
    layers, patterns = _layer_types(), skip_patterns(model)
    out: list[tuple[str, torch.nn.Module]] = []

    def walk(module: torch.nn.Module, prefix: str, skipped_above: bool, in_adaln: bool) -> None:
        skipped = skipped_above or any(re.search(p, prefix) for p in patterns)
        if isinstance(module, layers):
            if not skipped or (modulation and in_adaln):
                out.append((prefix, module))
            return
        if skipped and not modulation:
            return  # diffusers stops here; the opt-in looks inside for AdaLN linears
        adaln = type(module).__name__.startswith("AdaLayerNorm")
        for name, child in module.named_children():
            walk(child, f"{prefix}.{name}" if prefix else name, skipped, adaln)

    walk(model, "", False, False)
    return out


def cast_for_storage(model: torch.nn.Module, storage: torch.dtype, *, weights: DeferredWeights | None = None,
                     modulation: bool = False) -> list[torch.Tensor]:
    """Re-type every tensor of the storage leaves to `storage` (fp8), as `module.to(dtype=storage)` would:
    host tensors are converted now, tensors still in their files are read as fp8. Returns them."""
    cast: list[torch.Tensor] = []
    for _, leaf in storage_leaves(model, modulation=modulation):
        for t in [*leaf.parameters(recurse=False), *leaf.buffers(recurse=False)]:
            if not t.is_floating_point() or t.dtype == storage:
                continue
            if weights is not None and weights.knows(t):
                weights.retype(t, storage)
            else:
                rebind(t, lambda t=t: t.detach().to(storage))
            cast.append(t)
    return cast


def apply_storage_hooks(model: torch.nn.Module, storage: torch.dtype, compute: torch.dtype, *,
                        modulation: bool = False) -> None:
    """diffusers' own layerwise-casting hooks on the same selection (the resident reference, and
    `mode=resident` with a stream dtype)."""
    from diffusers.hooks.layerwise_casting import apply_layerwise_casting_hook

    for _, leaf in storage_leaves(model, modulation=modulation):
        apply_layerwise_casting_hook(leaf, storage, compute, non_blocking=False)


def compute_dtype_of(model: torch.nn.Module) -> torch.dtype:
    """The dtype the model computes in: its floating parameters' most common dtype before any cast."""
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.is_floating_point() and p.dtype not in STREAM_DTYPES.values():
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return max(counts, key=lambda d: counts[d]) if counts else torch.float32


# --- forecast from the safetensors headers (no model built) --------------------------------------

# Measured on the demo model (engine/demo/demo_model.py, float32 compute, "a photo of a cat", seed 0, its
# default 2 steps at 64x64), fp8 storage by diffusers' rule against the plain pipeline: mean and
# largest |difference| of the image's 0..255 values. tests/engine/test_stream_dtype.py re-measures it.
DEMO_PROMPT = "a photo of a cat"

