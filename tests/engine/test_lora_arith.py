"""engine/loading/lora_arith.py: PEFT's LoRA merge and forward without the multiply by a scaling of 1.0 give
PEFT's own bits, for every scaling, dtype and layout, and hand anything else back to PEFT."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model

from omni_console.engine.loading.lora_arith import layer_merge, merger, use_fast_forward


class Two(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.a = torch.nn.Linear(24, 40, dtype=dtype)
        self.b = torch.nn.Linear(40, 16, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.nn.functional.gelu(self.a(x)))


def lora_model(dtype: torch.dtype, alpha: float, seed: int = 0, **config: object) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = Two(dtype)
    model = inject_adapter_in_model(LoraConfig(r=8, lora_alpha=alpha, target_modules=["a", "b"], **config), model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.3)  # B starts at zero: give it values
    return model.to(dtype)


def peft_layers(model: torch.nn.Module) -> list:
    from peft.tuners.lora.layer import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


DTYPES = [torch.bfloat16, torch.float16, torch.float32]
ALPHAS = [8, 4, 5.6, 16]  # scalings 1.0 (skipped multiply), 0.5, 0.7, 2.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_the_merge_writes_the_bits_peft_merge_writes(dtype: torch.dtype, alpha: float):
    ours, theirs = lora_model(dtype, alpha), lora_model(dtype, alpha)
    for mine, peft_layer in zip(peft_layers(ours), peft_layers(theirs), strict=True):
        merger(mine, ["default"])()
        peft_layer.merge(safe_merge=False, adapter_names=["default"])
        assert torch.equal(mine.get_base_layer().weight, peft_layer.get_base_layer().weight)
        assert mine.merged_adapters == peft_layer.merged_adapters == ["default"]


@pytest.mark.parametrize("alpha", [8, 5.6])
def test_a_layer_merge_s_delta_and_mark_equal_its_merge(alpha: float):
    """The fused fp8 path adds `delta()` where the merge would add it, and marks the layer as the merge does."""
    ours, theirs = lora_model(torch.bfloat16, alpha), lora_model(torch.bfloat16, alpha)
    for mine, peft_layer in zip(peft_layers(ours), peft_layers(theirs), strict=True):
        entry = layer_merge(mine, ["default"])
        assert entry.weight is mine.get_base_layer().weight
        with torch.no_grad():
            entry.weight.add_(entry.delta())
        entry.merged()
        peft_layer.merge(safe_merge=False, adapter_names=["default"])
        assert torch.equal(mine.get_base_layer().weight, peft_layer.get_base_layer().weight)
        assert mine.merged_adapters == ["default"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_the_forward_gives_the_bits_peft_forward_gives(dtype: torch.dtype, alpha: float):
    ours, theirs = lora_model(dtype, alpha), lora_model(dtype, alpha)
    assert use_fast_forward(ours) == 2
    x = torch.randn(5, 24, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))
        for layer in peft_layers(ours):  # a disabled adapter, and a merged layer, go through PEFT's own forward
            layer.enable_adapters(False)
        for layer in peft_layers(theirs):
            layer.enable_adapters(False)
        assert torch.equal(ours(x), theirs(x))


def test_fan_in_fan_out_layers_merge_to_peft_bits():
    """A Conv1D-style layout (GPT-2's): PEFT transposes B·A; so does the merge here."""

    class Transposed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(24, 40, dtype=torch.bfloat16)

    def build() -> torch.nn.Module:
        torch.manual_seed(1)
        model = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, target_modules=["a"]), Transposed())
        for layer in peft_layers(model):
            layer.fan_in_fan_out = True
            layer.get_base_layer().weight.data = layer.get_base_layer().weight.data.T.contiguous()
            with torch.no_grad():
                layer.lora_B["default"].weight.normal_()
        return model

    ours, theirs = build(), build()
    (mine,), (peft_layer,) = peft_layers(ours), peft_layers(theirs)
    merger(mine, ["default"])()
    peft_layer.merge(safe_merge=False, adapter_names=["default"])
    assert torch.equal(mine.get_base_layer().weight, peft_layer.get_base_layer().weight)


def test_what_the_fast_path_does_not_cover_goes_through_peft():
    """Dropout (training), DoRA and a LoRA bias are PEFT's: the forward and the merge hand them over, and a layer
    with two adapters is never fused (its merge order is PEFT's)."""
    x = torch.randn(5, 24)
    for config in ({"lora_dropout": 0.5}, {"use_dora": True}, {"lora_bias": True}):
        ours, theirs = lora_model(torch.float32, 4, **config), lora_model(torch.float32, 4, **config)
        use_fast_forward(ours)
        ours.eval(), theirs.eval()
        with torch.no_grad():
            assert torch.equal(ours(x), theirs(x)), config
        for mine, peft_layer in zip(peft_layers(ours), peft_layers(theirs), strict=True):
            assert layer_merge(mine, ["default"]).weight is None, config
            merger(mine, ["default"])()
            peft_layer.merge(safe_merge=False, adapter_names=["default"])
            assert torch.equal(mine.get_base_layer().weight, peft_layer.get_base_layer().weight), config
    second = LoraConfig(r=4, lora_alpha=4, target_modules=["a", "b"])
    two = inject_adapter_in_model(second, lora_model(torch.float32, 8), adapter_name="second")
    for layer in peft_layers(two):
        assert set(layer.lora_A) == {"default", "second"}
        assert layer_merge(layer, ["default", "second"]).weight is None
