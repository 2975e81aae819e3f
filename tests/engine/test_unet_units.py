"""A UNet block's units: its children in the order its class's forward calls them, or the whole block
when the class or the layout is not one whose order is known (an order is never guessed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_console.engine.model_dir.blocks import unet_block_lists, unit_order
from omni_console.engine.model_dir.weights import TensorInfo

HERE = Path("unet")


def _tensors(*names: str) -> list[TensorInfo]:
    return [TensorInfo(name, "float32", (4,), HERE / "w.safetensors") for name in names]  # 16 bytes each


def _config(down: list[str], up: list[str], mid: str | None = "UNetMidBlock2DCrossAttn") -> dict:
    return {"down_block_types": down, "up_block_types": up, "mid_block_type": mid}


def test_cross_attention_blocks_interleave_resnets_and_attentions_then_the_sampler():
    paths = {"resnets.1": 1, "attentions.0": 1, "downsamplers.0": 1, "resnets.0": 1, "attentions.1": 1}
    assert unit_order("CrossAttnDownBlock2D", paths) == [
        "resnets.0", "attentions.0", "resnets.1", "attentions.1", "downsamplers.0"]
    assert unit_order("UNetMidBlock2DCrossAttn", {"resnets.0": 1, "resnets.1": 1, "attentions.0": 1}) == [
        "resnets.0", "attentions.0", "resnets.1"]
    assert unit_order("UpBlock2D", {"upsamplers.0": 1, "resnets.0": 1, "resnets.1": 1}) == [
        "resnets.0", "resnets.1", "upsamplers.0"]


@pytest.mark.parametrize(("cls", "paths"), [
    ("SimpleCrossAttnDownBlock2D", {"resnets.0": 1, "attentions.0": 1}),  # class not in the table
    (None, {"resnets.0": 1}),  # the config names no class
    ("CrossAttnDownBlock2D", {"resnets.0": 1, "resnets.1": 1, "attentions.0": 1}),  # zip would skip one
    ("DownBlock2D", {"resnets.0": 1, "attentions.0": 1}),  # a child the class has not
    ("DownBlock2D", {"resnets.0": 1, "": 1}),  # a tensor directly on the block
    ("UpBlock2D", {"resnets.1": 1}),  # not numbered from 0
])
def test_an_unknown_class_or_layout_has_no_unit_order(cls, paths):
    assert unit_order(cls, paths) is None


def test_unknown_blocks_stay_whole_while_known_ones_split():
    tensors = _tensors(
        "conv_in.weight",
        "down_blocks.0.resnets.0.conv1.weight", "down_blocks.0.resnets.0.conv2.weight",
        "down_blocks.0.downsamplers.0.conv.weight",
        "down_blocks.1.resnets.0.conv1.weight", "down_blocks.1.attentions.0.proj_in.weight",
        "mid_block.resnets.0.conv1.weight", "mid_block.attentions.0.proj_in.weight",
        "mid_block.resnets.1.conv1.weight",
        "up_blocks.0.resnets.0.conv1.weight", "up_blocks.0.attentions.0.proj_in.weight",
    )
    config = _config(["DownBlock2D", "UNetResSimpleCrossAttnDownBlock2D"], ["CrossAttnUpBlock2D"])
    lists = unet_block_lists(HERE, "UNet2DConditionModel", config, tensors)
    assert [(b.attr, b.items, b.block_bytes) for b in lists] == [
        ("down_blocks.0", ("resnets.0", "downsamplers.0"), (32, 16)),
        ("down_blocks.1", (), (32,)),  # SimpleCrossAttnDownBlock2D: one unit, as before
        ("mid_block", ("resnets.0", "attentions.0", "resnets.1"), (16, 16, 16)),
        ("up_blocks.0", ("resnets.0", "attentions.0"), (16, 16)),
    ]
    whole_mid = unet_block_lists(HERE, "UNet2DConditionModel", {**config, "mid_block_type": "UNetMidBlock2D"},
                                 tensors)
    assert [(b.attr, b.items, b.block_bytes) for b in whole_mid if b.attr == "mid_block"] == [
        ("mid_block", (), (48,))]
