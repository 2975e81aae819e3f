"""PEFT's LoRA arithmetic, the same bits, without a multiply by a scaling of 1.0.

PEFT computes a vanilla LoRA linear as `result + B(A(x)) * scaling` (the sidecar) and merges it as
`weight += (B @ A) * scaling`. A scaling of 1.0 is diffusers' default (a file with no alpha, or alpha equal to
the rank, at scale 1), and multiplying by 1.0 returns its input's bits, yet it costs a full read and write of
an activation per linear per forward (sidecar), or of a weight per streamed block per arrival (merge: a third of
its memory traffic). Where a step is compute-bound (fp8 storage halves the link's share) that pass shows in
every step. Here each layer does what PEFT does in PEFT's order and dtypes, leaving out only that multiply;
anything this does not cover (a variant such as DoRA, a LoRA bias, dropout, mixed-batch adapter names, a
disabled or merged layer, a layer other than a Linear) goes through PEFT's own code.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ...offload.lora_merge import LayerMerge


def _lora_linear() -> type:
    from peft.tuners.lora.layer import Linear

    return Linear


def _vanilla(layer: Any, name: str) -> bool:
    """Adapter `name` of `layer` is a plain LoRA whose arithmetic this module reproduces."""
    return (name in layer.lora_A and name not in layer.lora_variant and not layer.lora_bias.get(name, False)
            and isinstance(layer.lora_dropout[name], torch.nn.Identity))


def _wanted(layer: Any, names: list[str]) -> list[str]:
    return [n for n in names if n in layer.scaling]


def _plain_linear(layer: Any, names: list[str]) -> bool:
    """`layer` is PEFT's LoRA Linear (or ours) and each of `names` on it is a plain LoRA."""
    return type(layer) in (_lora_linear(), _fast_linear()) and all(_vanilla(layer, n) for n in names)


def delta_weight(layer: Any, name: str) -> torch.Tensor:
    """PEFT's `get_delta_weight` (the CPU's float32 detour for 16-bit weights included), without `* 1.0`."""
    weight_a, weight_b = layer.lora_A[name].weight, layer.lora_B[name].weight
    dtype = weight_b.dtype
    cast = weight_b.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16)
    if cast:
        weight_a, weight_b = weight_a.float(), weight_b.float()
    delta = weight_b @ weight_a
    if layer.fan_in_fan_out:
        delta = delta.T
    scaling = layer.scaling[name]
    if scaling != 1.0:
        delta = delta * scaling
    return delta.to(dtype=dtype) if cast else delta


def layer_merge(layer: Any, names: list[str]) -> LayerMerge:
    """`merger`'s merge, plus, for one plain LoRA on a Linear, its delta and mark for a streamed fp8 weight to take
    the delta as it is upcast (offload/lora_merge.py)."""
    merge = merger(layer, names)
    wanted = _wanted(layer, names)
    if len(wanted) != 1 or not _plain_linear(layer, wanted):
        return LayerMerge(merge)
    name = wanted[0]

    def merged() -> None:
        layer.merged_adapters[:] = [name]

    return LayerMerge(merge, layer.get_base_layer().weight, lambda: delta_weight(layer, name), merged)


def merger(layer: Any, names: list[str]) -> Callable[[], None]:
    """A function that merges `names` into `layer`'s weight as it is bound when called (PEFT's `merge` with
    `safe_merge=False`, what `fuse_lora` calls), marking the layer merged; PEFT's own merge where an adapter is
    not a plain LoRA on a Linear."""
    wanted = _wanted(layer, names)
    fast = _plain_linear(layer, wanted)

    def merge() -> None:
        layer.merged_adapters.clear()  # the weight holds its unmerged bytes again (a fresh slot or copy)
        if not fast:
            layer.merge(safe_merge=False, adapter_names=wanted)
            return
        weight = layer.get_base_layer().weight
        for name in wanted:
            weight.data += delta_weight(layer, name)
            layer.merged_adapters.append(name)

    return merge


@functools.cache
def _fast_linear() -> type:
    """PEFT's LoRA `Linear` with the forward below (made once: a layer's class is switched to it, so no layer
    holds a bound method of itself, a cycle that would keep its A/B alive until the next garbage collection)."""

    class FastLoraLinear(_lora_linear()):  # type: ignore[misc]
        """PEFT's `Linear.forward` on its common path, without `* scaling` where the scaling is 1.0."""

        def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if args or kwargs or self.disable_adapters or self.merged:
                return super().forward(x, *args, **kwargs)
            active = [n for n in self.active_adapters if n in self.lora_A]
            if not all(_vanilla(self, n) for n in active):
                return super().forward(x, *args, **kwargs)
            result = self.base_layer(x)
            result_dtype = result.dtype
            for name in active:
                lora_a, lora_b, scaling = self.lora_A[name], self.lora_B[name], self.scaling[name]
                x = self._cast_input_dtype(x, lora_a.weight.dtype)
                update = lora_b(lora_a(x))
                result = result + (update if scaling == 1.0 else update * scaling)
            return result.to(result_dtype)

    return FastLoraLinear


def use_fast_forward(module: torch.nn.Module) -> int:
    """Switch every PEFT LoRA Linear under `module` to the forward above; returns how many layers have it."""
    linear, fast = _lora_linear(), _fast_linear()
    count = 0
    for layer in module.modules():
        if type(layer) is linear:
            layer.__class__ = fast
        count += type(layer) is fast
    return count
