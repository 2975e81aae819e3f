"""fp8 storage for UNets (SD1.5, SDXL): the units stream fp8 bytes and are upcast on the device, and the
images are bit-identical to diffusers' own `enable_layerwise_casting` on the UNet, for every policy."""

from __future__ import annotations

from pathlib import Path

import diffusers
import numpy as np
import pytest
import torch
from tiny_families_unet import UNET_GENERATION, build_tiny_sd15, build_tiny_sdxl

from omni_console.engine.engine import Engine
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy

FP8 = torch.float8_e4m3fn
FAMILIES = {"sd15": (build_tiny_sd15, diffusers.StableDiffusionPipeline),
            "sdxl": (build_tiny_sdxl, diffusers.StableDiffusionXLPipeline)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def unet_dir(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    family = request.param
    return family, FAMILIES[family][0](tmp_path_factory.mktemp("models") / family)


def _request(family: str) -> GenerateRequest:
    gen = UNET_GENERATION[family]
    return GenerateRequest(prompt="a lighthouse on a cliff", steps=gen["num_inference_steps"], height=gen["height"],
                           width=gen["width"], seed=11, guidance=6.0, output_type="np")


def test_the_plan_streams_the_units_fp8_bytes(unet_dir):
    _, path = unet_dir
    model = discover_model(path)
    plain = make_plan(model, build_policy({}, 0))
    fp8 = make_plan(model, build_policy({}, 0, stream_dtype="float8_e4m3fn"))
    assert fp8.stream_dtype == "float8_e4m3fn"
    # float32 fixture, convolutions and linears in fp8, norms kept: well under half the bytes
    assert fp8.forecast.streamed_bytes_per_forward < 0.4 * plain.forecast.streamed_bytes_per_forward
    assert fp8.forecast.pinned_host_bytes < plain.forecast.pinned_host_bytes
    assert fp8.forecast.upcast_scratch_bytes >= fp8.forecast.largest_streamed_block_bytes


@pytest.mark.slow
def test_units_match_diffusers_layerwise_casting_on_the_unet(unet_dir):
    family, path = unet_dir
    req = _request(family)
    pipe = FAMILIES[family][1].from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    plain = np.asarray(pipe(**req.call_kwargs(pipe)).images[0])
    pipe.unet.enable_layerwise_casting(storage_dtype=FP8, compute_dtype=torch.float32)
    expected = np.asarray(pipe(**req.call_kwargs(pipe)).images[0])
    assert not np.array_equal(plain, expected)  # fp8 storage does change the image
    model = discover_model(path)
    engine = Engine(path, device="cpu")
    for comps, layers, mode, placement in (({}, 0, "dlo", "leading"), ({"default": False}, 3, "dlo", "leading"),
                                           ({}, 4, "dlo", "spread"), (None, 0, "resident", "leading")):
        policy = build_policy(comps, layers, mode, placement, stream_dtype="float8_e4m3fn")
        report = engine.load(policy)
        if mode == "dlo":
            streamer = engine.placement.streamer
            assert FP8 in {x.dtype for b in streamer._blocks for x in b.bindings}  # 8-bit in the arena
            forecast = make_plan(model, policy).forecast
            assert report.streamed_bytes == pytest.approx(forecast.streamed_bytes_per_forward, rel=0.02)
        got = np.asarray(engine.generate(req).image)
        assert np.array_equal(got, expected), (family, comps, layers, mode, placement)
        engine.unload()
    engine.close()
