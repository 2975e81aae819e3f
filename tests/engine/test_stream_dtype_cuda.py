"""fp8 storage on CUDA: the upcast on the compute stream, behind the copy's wait, gives diffusers'
layerwise casting bit for bit for every policy; pinned bytes shrink to the fp8 arena."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_families import FAMILY_GENERATION

from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
FP8 = torch.float8_e4m3fn


def demo_request() -> GenerateRequest:
    gen = dict(FAMILY_GENERATION["flux"])
    return GenerateRequest(prompt="a lighthouse", steps=gen.pop("num_inference_steps"), height=gen.pop("height"),
                           width=gen.pop("width"), seed=11, extra=gen)


def layerwise_casting_image(model_dir: Path) -> np.ndarray:
    """The demo through plain diffusers with fp8 layerwise casting on the GPU (the exactness reference);
    the pipeline is released before the engine loads."""
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(model_dir, local_files_only=True)
    pipe.transformer.enable_layerwise_casting(storage_dtype=FP8, compute_dtype=torch.float32)
    pipe.to("cuda")
    pipe.set_progress_bar_config(disable=True)
    image = np.asarray(pipe(**demo_request().call_kwargs(pipe)).images[0])
    del pipe
    gc.collect()
    torch.cuda.empty_cache()
    return image


def test_fp8_storage_matches_layerwise_casting_on_cuda(demo_model_dir: Path):
    expected = layerwise_casting_image(demo_model_dir)
    pinned: dict[str | None, int] = {}
    for live in (False, True):
        engine = Engine(demo_model_dir, device="cuda", options=EngineOptions(live_replan=live))
        for layers, slots, placement in ((0, 2, "leading"), (2, 3, "spread"), (0, 6, "leading")):
            for dtype in (None, "float8_e4m3fn"):
                report = engine.load(build_policy({}, layers, "dlo", placement, slots, stream_dtype=dtype))
                if not live and layers == 0 and slots == 2:
                    pinned[dtype] = report.block_host_bytes
                if dtype is not None:
                    image = np.asarray(engine.generate(demo_request()).image)
                    assert np.array_equal(image, expected), (live, layers, slots, placement)
                engine.unload()
        engine.close()
    assert pinned["float8_e4m3fn"] < 0.5 * pinned[None]  # float32 demo: linears at one byte instead of four
