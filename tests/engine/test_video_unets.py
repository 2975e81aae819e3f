"""Video UNets stream unit by unit, as SD's UNets do: Stable Video Diffusion's spatio-temporal UNet and
AnimateDiff's motion UNet, each down/mid/up block's children (resnets, attentions, motion modules, samplers) in
the order its forward calls them (diffusers' unets/unet_3d_blocks.py and unets/unet_motion_model.py), and the
video is bit-identical to the plain pipeline's under every policy. Before, each UNet was staged whole: all of it
on the card during each step, so a card smaller than the UNet could not run it at all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors import safe_open

from omni_console.engine.engine import Engine
from omni_console.engine.events import StepTiming
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.events import StagingEvent
from omni_console.offload.policy import build_policy

UNET_HEADS = ("down_blocks", "mid_block", "up_blocks")
FAMILIES = ("svd", "animatediff")

# the units each family's tiny UNet is split into, in call order
UNITS = {
    "svd": [
        ("down_blocks.0", ("resnets.0", "attentions.0", "resnets.1", "attentions.1", "downsamplers.0")),
        ("down_blocks.1", ("resnets.0", "resnets.1")),
        ("mid_block", ("resnets.0", "attentions.0", "resnets.1")),
        ("up_blocks.0", ("resnets.0", "resnets.1", "resnets.2", "upsamplers.0")),
        ("up_blocks.1", ("resnets.0", "attentions.0", "resnets.1", "attentions.1", "resnets.2", "attentions.2")),
    ],
    "animatediff": [
        ("down_blocks.0", ("resnets.0", "attentions.0", "motion_modules.0", "resnets.1", "attentions.1",
                           "motion_modules.1", "downsamplers.0")),
        ("down_blocks.1", ("resnets.0", "motion_modules.0", "resnets.1", "motion_modules.1")),
        ("mid_block", ("resnets.0", "attentions.0", "motion_modules.0", "resnets.1")),
        ("up_blocks.0", ("resnets.0", "attentions.0", "motion_modules.0", "resnets.1", "attentions.1",
                         "motion_modules.1", "resnets.2", "attentions.2", "motion_modules.2", "upsamplers.0")),
        ("up_blocks.1", ("resnets.0", "motion_modules.0", "resnets.1", "motion_modules.1", "resnets.2",
                         "motion_modules.2")),
    ],
}


@pytest.fixture(scope="module")
def video_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tiny_families_video_unets import make_animatediff_pipeline, make_svd_pipeline

    from omni_console.engine.demo.demo_model import save_pipeline

    root = tmp_path_factory.mktemp("video-unets")
    for name, make in (("svd", make_svd_pipeline), ("animatediff", make_animatediff_pipeline)):
        save_pipeline(make(0), root / name)
    pixels = np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3)
    Image.fromarray(pixels).save(root / "in.png")
    return {"svd": root / "svd", "animatediff": root / "animatediff", "image": root / "in.png"}


def _request(dirs: dict[str, Path], family: str, steps: int = 2) -> GenerateRequest:
    if family == "svd":  # image to video: no prompt
        return GenerateRequest(prompt="unused", steps=steps, height=32, width=32, seed=5, image=dirs["image"],
                               frames=2, output_type="np")
    return GenerateRequest(prompt="a lighthouse", steps=steps, height=32, width=32, seed=5, frames=2,
                           guidance=7.5, output_type="np")


def _plain(path: Path):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _planned_units(path: Path) -> list[str]:
    unet = discover_model(path).component("unet")
    return [f"{b.attr}.{item}" for b in unet.block_lists for item in b.items]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_video_unet_is_split_into_its_units(video_dirs: dict[str, Path], family: str):
    unet = discover_model(video_dirs[family]).component("unet")
    assert unet.role == "unet"
    assert [(b.attr, b.items) for b in unet.block_lists] == UNITS[family]
    sizes: dict[str, int] = {}
    with safe_open(str(video_dirs[family] / "unet" / "diffusion_pytorch_model.safetensors"), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            parts = key.split(".")
            if parts[0] in UNET_HEADS:
                unit = ".".join(parts[:3] if parts[0] == "mid_block" else parts[:4])
                tensor = f.get_tensor(key)
                sizes[unit] = sizes.get(unit, 0) + tensor.numel() * tensor.element_size()
    planned = {f"{b.attr}.{item}": n for b in unet.block_lists for item, n in zip(b.items, b.block_bytes, strict=True)}
    assert planned == sizes  # every block tensor in exactly one unit


@pytest.mark.parametrize("family", FAMILIES)
def test_unit_order_is_the_order_a_real_forward_calls_them(video_dirs: dict[str, Path], family: str):
    planned = _planned_units(video_dirs[family])
    pipe = _plain(video_dirs[family])
    calls: list[str] = []
    for unit in planned:
        pipe.unet.get_submodule(unit).register_forward_pre_hook(lambda *_, unit=unit: calls.append(unit))
    pipe(**_request(video_dirs, family, steps=1).call_kwargs(pipe))
    assert calls == planned  # one forward a step (both guidance halves in one batch): each unit once, in order


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_bit_identical_to_plain_diffusers_and_streamed_ahead_under_every_policy(video_dirs: dict[str, Path],
                                                                               family: str):
    request = _request(video_dirs, family, steps=3)
    pipe = _plain(video_dirs[family])
    expected = np.asarray(pipe(**request.call_kwargs(pipe)).frames[0])
    assert expected.shape == (2, 32, 32, 3) and float(expected.std()) > 0
    engine = Engine(video_dirs[family], device="cpu")
    sub = engine.bus.subscribe()
    units = engine.model.num_dit_blocks
    try:
        for comps, layers, placement, slots in (({}, 0, "leading", 2), ({"default": False}, 3, "spread", 3),
                                                ({"vae": False}, units, "leading", 2)):
            engine.load(build_policy(comps, layers, "dlo", placement, slots))
            assert engine.placement.streamer.num_streamed == units - layers
            sub.drain()
            result = engine.generate(request)
            events = sub.drain()
            engine.unload()
            assert np.array_equal(np.stack(result.frames), expected), (comps, layers)
            assert len([e for e in events if isinstance(e, StepTiming)]) == 3
            first_end = next(i for i, e in enumerate(events) if isinstance(e, StepTiming))
            later = [e for e in events[first_end:] if isinstance(e, StagingEvent) and e.target.startswith("unet.")]
            assert not [e for e in later if e.sync], "a unit was fetched synchronously after the first step"
            assert len({e.target for e in later}) == units - layers  # every streamed unit, prefetched
    finally:
        engine.close()


def test_the_motion_unets_mid_block_follows_its_flag_and_a_layout_off_the_call_order_is_one_unit():
    from omni_console.engine.model_dir.blocks import mid_block_type, unit_order

    assert mid_block_type("UNetMotionModel", {}) == "UNetMidBlockCrossAttnMotion"  # diffusers' default: True
    assert mid_block_type("UNetMotionModel", {"use_motion_mid_block": False}) == "UNetMidBlock2DCrossAttn"
    assert mid_block_type("UNet2DConditionModel", {"mid_block_type": "UNetMidBlock2DSimpleCrossAttn"}) \
        == "UNetMidBlock2DSimpleCrossAttn"
    mid = {"resnets.0": 1, "resnets.1": 1, "attentions.0": 1, "motion_modules.0": 1}
    assert unit_order("UNetMidBlockCrossAttnMotion", mid) == ["resnets.0", "attentions.0", "motion_modules.0",
                                                             "resnets.1"]
    assert unit_order("UNetMidBlock2DCrossAttn", mid) is None  # motion modules it would never call: one unit
    assert unit_order("DownBlockMotion", {"resnets.0": 1, "resnets.1": 1, "motion_modules.0": 1}) is None


def test_animatediffs_motion_adapter_is_never_placed_nor_read(video_dirs: dict[str, Path], capsys):
    """The saved UNetMotionModel already holds the adapter's motion modules: the adapter is planned as unused (no
    device or host bytes, said in the plan), built from its config on the meta device, and the run still matches
    plain diffusers (the bit-identical test above runs with it so)."""
    import dataclasses

    from omni_console.console.cli import main
    from omni_console.engine.model_dir.unused import mark_unused

    path = video_dirs["animatediff"]
    model = discover_model(path)
    adapter = next(c for c in model.components if c.name == "motion_adapter")
    assert adapter.unused and "unet (UNetMotionModel)" in adapter.unused
    assert any(n.startswith("motion_adapter (MotionAdapter): never called") for n in model.notes)
    # a directory whose unet is a plain UNet2DConditionModel builds the motion UNet from the adapter: used
    plain_unet = [dataclasses.replace(c, class_name="UNet2DConditionModel") if c.name == "unet" else
                  dataclasses.replace(c, unused=None) for c in model.components]
    assert not any(c.unused for c in mark_unused(plain_unet))

    import json

    capsys.readouterr()
    assert main(["plan", "--model", str(path), "--device", "cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    row = next(c for c in doc["components"] if c["name"] == "motion_adapter")
    assert (row["residency"], row["why"], row["device_bytes"], row["host_bytes"]) == ("none", "unused", 0, 0)

    engine = Engine(path, device="cpu")
    try:
        engine.load(build_policy({}, 0))
        params = list(engine.pipe.motion_adapter.parameters())
        assert params and all(p.is_meta for p in params)  # nothing read, nothing allocated
    finally:
        engine.close()
