"""Small LoRA files for tests, written in the key styles real LoRAs use (diffusers/PEFT and kohya / sd-scripts).

The diffusers/PEFT writer takes module names and shapes from the model directory's own safetensors headers
(no model is built); the kohya writer uses sd-scripts' names for Flux's original (BFL) layout, which diffusers'
converter maps onto the diffusers modules (all but the single blocks' `linear1`, which it splits at
Flux-dev's own widths).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def weight_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor name and shape of a component folder's safetensors files."""
    out: dict[str, tuple[int, ...]] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as handle:
            for name in handle.keys():  # noqa: SIM118 (not a dict)
                out[name] = tuple(handle.get_slice(name).get_shape())
    return out


def write_peft_lora(path: Path, folder: Path, prefix: str, *, pattern: str, rank: int = 4, seed: int = 0,
                    alpha: float | None = None) -> Path:
    """`{prefix}.{module}.lora_A.weight` / `lora_B.weight` for every 2-D weight of `folder` matching `pattern`."""
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in weight_shapes(folder).items():
        if len(shape) != 2 or not name.endswith(".weight") or not re.search(pattern, name):
            continue
        module = name[: -len(".weight")]
        tensors[f"{prefix}.{module}.lora_A.weight"] = torch.randn(rank, shape[1], generator=g) * 0.2
        tensors[f"{prefix}.{module}.lora_B.weight"] = torch.randn(shape[0], rank, generator=g) * 0.2
        if alpha is not None:
            tensors[f"{prefix}.{module}.alpha"] = torch.tensor(alpha)
    assert tensors, f"nothing in {folder} matches {pattern}"
    save_file(tensors, str(path))
    return path


def write_kohya_flux_lora(path: Path, *, double: int, single: int, inner: int, mlp: int, rank: int = 4,
                          seed: int = 0, alpha: float = 2.0) -> Path:
    """sd-scripts' Flux names (`lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight`, `.alpha`)."""
    g = torch.Generator().manual_seed(seed)
    layers: dict[str, tuple[int, int]] = {}
    for i in range(double):
        for side in ("img", "txt"):
            layers[f"double_blocks_{i}_{side}_attn_qkv"] = (inner, 3 * inner)
            layers[f"double_blocks_{i}_{side}_attn_proj"] = (inner, inner)
            layers[f"double_blocks_{i}_{side}_mlp_0"] = (inner, mlp)
            layers[f"double_blocks_{i}_{side}_mlp_2"] = (mlp, inner)
    for i in range(single):  # not linear1: diffusers splits it at Flux-dev's own widths (3072, 12288)
        layers[f"single_blocks_{i}_linear2"] = (inner + mlp, inner)
    tensors: dict[str, torch.Tensor] = {}
    for layer, (fan_in, fan_out) in layers.items():
        key = f"lora_unet_{layer}"
        tensors[f"{key}.lora_down.weight"] = torch.randn(rank, fan_in, generator=g) * 0.2
        tensors[f"{key}.lora_up.weight"] = torch.randn(fan_out, rank, generator=g) * 0.2
        tensors[f"{key}.alpha"] = torch.tensor(alpha)
    save_file(tensors, str(path))
    return path


def write_kohya_unet_lora(path: Path, folder: Path, *, pattern: str, rank: int = 4, seed: int = 0,
                          alpha: float = 2.0) -> Path:
    """sd-scripts' names for a diffusers-layout UNet (`lora_unet_down_blocks_1_attentions_0_..._to_q.lora_down.weight`,
    `.alpha`), for every 2-D weight of `folder` matching `pattern`; diffusers' converter maps them back."""
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in weight_shapes(folder).items():
        if len(shape) != 2 or not name.endswith(".weight") or not re.search(pattern, name):
            continue
        key = "lora_unet_" + name[: -len(".weight")].replace(".", "_")
        tensors[f"{key}.lora_down.weight"] = torch.randn(rank, shape[1], generator=g) * 0.2
        tensors[f"{key}.lora_up.weight"] = torch.randn(shape[0], rank, generator=g) * 0.2
        tensors[f"{key}.alpha"] = torch.tensor(alpha)
    assert tensors, f"nothing in {folder} matches {pattern}"
    save_file(tensors, str(path))
    return path
