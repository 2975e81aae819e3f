"""Stable Video Diffusion's spatio-temporal UNet streams unit by unit, as SD's UNets do: each down/mid/up block's
resnets, attentions and samplers in the order its forward calls them (diffusers' unets/unet_3d_blocks.py), and
the video is bit-identical to the plain pipeline's under every policy. Before, the UNet was staged whole: the
whole 1.5B-parameter UNet on the card during each step, so a small card could not run it at all."""

from __future__ import annotations

from dataclasses import replace
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


@pytest.fixture(scope="module")
def svd_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_families_svd import make_svd_pipeline

    from omni_console.engine.demo.demo_model import save_pipeline

    path = tmp_path_factory.mktemp("svd") / "svd"
    save_pipeline(make_svd_pipeline(0), path)
    return path


@pytest.fixture(scope="module")
def condition(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("svd-in") / "in.png"
    pixels = np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3)
    Image.fromarray(pixels).save(path)
    return path


def _request(image: Path, steps: int = 2) -> GenerateRequest:
    return GenerateRequest(prompt="unused", steps=steps, height=32, width=32, seed=5, image=image, frames=2,
                           output_type="np")


def _plain(path: Path):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _planned_units(path: Path) -> list[str]:
    unet = discover_model(path).component("unet")
    return [f"{b.attr}.{item}" for b in unet.block_lists for item in b.items]


def test_the_spatio_temporal_unet_is_split_into_its_units(svd_dir: Path):
    unet = discover_model(svd_dir).component("unet")
    assert unet.role == "unet"
    assert [(b.attr, b.items) for b in unet.block_lists] == [
        ("down_blocks.0", ("resnets.0", "attentions.0", "resnets.1", "attentions.1", "downsamplers.0")),
        ("down_blocks.1", ("resnets.0", "resnets.1")),
        ("mid_block", ("resnets.0", "attentions.0", "resnets.1")),
        ("up_blocks.0", ("resnets.0", "resnets.1", "resnets.2", "upsamplers.0")),
        ("up_blocks.1", ("resnets.0", "attentions.0", "resnets.1", "attentions.1", "resnets.2", "attentions.2")),
    ]
    sizes: dict[str, int] = {}
    with safe_open(str(svd_dir / "unet" / "diffusion_pytorch_model.safetensors"), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            parts = key.split(".")
            if parts[0] in UNET_HEADS:
                unit = ".".join(parts[:3] if parts[0] == "mid_block" else parts[:4])
                tensor = f.get_tensor(key)
                sizes[unit] = sizes.get(unit, 0) + tensor.numel() * tensor.element_size()
    planned = {f"{b.attr}.{item}": n for b in unet.block_lists for item, n in zip(b.items, b.block_bytes, strict=True)}
    assert planned == sizes  # every block tensor in exactly one unit


def test_unit_order_is_the_order_a_real_forward_calls_them(svd_dir: Path, condition: Path):
    planned = _planned_units(svd_dir)
    pipe = _plain(svd_dir)
    calls: list[str] = []
    for unit in planned:
        pipe.unet.get_submodule(unit).register_forward_pre_hook(lambda *_, unit=unit: calls.append(unit))
    pipe(**_request(condition, steps=1).call_kwargs(pipe))
    assert calls == planned  # one forward a step (both guidance halves in one batch): each unit once, in order


@pytest.mark.slow
def test_bit_identical_to_plain_diffusers_and_streamed_ahead_under_every_policy(svd_dir: Path, condition: Path):
    request = _request(condition, steps=3)
    pipe = _plain(svd_dir)
    expected = np.asarray(pipe(**request.call_kwargs(pipe)).frames[0])
    assert expected.shape == (2, 32, 32, 3) and float(expected.std()) > 0
    engine = Engine(svd_dir, device="cpu")
    sub = engine.bus.subscribe()
    units = engine.model.num_dit_blocks
    try:
        for comps, layers, placement, slots in (({}, 0, "leading", 2), ({"default": False}, 3, "spread", 3),
                                                ({"vae": False}, units, "leading", 2)):
            engine.load(build_policy(comps, layers, "dlo", placement, slots))
            assert engine.placement.streamer.num_streamed == units - layers
            sub.drain()
            result = engine.generate(replace(request))
            events = sub.drain()
            engine.unload()
            assert np.array_equal(np.stack(result.frames), expected), (comps, layers)
            steps = [e for e in events if isinstance(e, StepTiming)]
            assert len(steps) == 3
            first_end = next(i for i, e in enumerate(events) if isinstance(e, StepTiming))
            later = [e for e in events[first_end:] if isinstance(e, StagingEvent) and e.target.startswith("unet.")]
            assert not [e for e in later if e.sync], "a unit was fetched synchronously after the first step"
            assert len({e.target for e in later}) == units - layers  # every streamed unit, prefetched
            if layers < units:
                assert all(s.h2d_bytes > 0 for s in steps[1:])  # the streamed units crossed every step
    finally:
        engine.close()
