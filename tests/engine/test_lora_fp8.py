"""LoRAs with fp8 storage (`--stream-dtype float8_e4m3fn`): the delta lands on the upcast weights, never in fp8.

The reference is plain diffusers whose fp8-stored layers (diffusers' layerwise-casting selection) hold their
weights rounded through fp8 and back, as the streamer's upcast computes with them, then `load_lora_weights` +
`set_adapters` (sidecar) or `fuse_lora(lora_scale=)` (merge, into the upcast weights).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from lora_writers import write_peft_lora
from test_lora import FLUX_REQUEST

from omni_console.engine.engine import Engine
from omni_console.engine.loading.stream_dtype import storage_leaves
from omni_console.engine.options import EngineOptions
from omni_console.offload.policy import build_policy

FP8 = torch.float8_e4m3fn


def rounded_reference(path: Path, lora: Path, scale: float, mode: str, request=FLUX_REQUEST) -> np.ndarray:
    from diffusers import DiffusionPipeline

    from omni_console.engine.running.step_cache import cache_config

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        for _, leaf in storage_leaves(pipe.transformer):
            for p in leaf.parameters(recurse=False):
                p.copy_(p.to(FP8).to(p.dtype))
    pipe.load_lora_weights(str(lora), adapter_name="a")
    if mode == "merge":
        pipe.fuse_lora(lora_scale=scale)
    else:
        pipe.set_adapters(["a"], [scale])
    if request.cache is not None:
        pipe.transformer.enable_cache(cache_config(request.cache, pipe))
    return np.asarray(pipe(**request.call_kwargs(pipe)).images)


@pytest.mark.slow  # two loads per mode, two plain pipelines
@pytest.mark.parametrize("mode", ["sidecar", "merge"])
def test_fp8_storage_with_a_lora_matches_the_rounded_pipeline(demo_model_dir: Path, tmp_path: Path, mode: str):
    lora = write_peft_lora(tmp_path / "l.safetensors", demo_model_dir / "transformer", "transformer",
                           pattern=r"attn\.(to_|add_)|ff", seed=6)
    expected = rounded_reference(demo_model_dir, lora, 0.7, mode)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(loras=((str(lora), 0.7),), lora_mode=mode))
    try:
        policies = [build_policy({}, 0, stream_dtype="float8_e4m3fn"),
                    build_policy({}, 0, prefetch_slots=6, stream_dtype="float8_e4m3fn"),
                    build_policy({}, 2, stream_dtype="float8_e4m3fn", upcast_resident=2)]  # resident kept upcast
        if mode == "sidecar":  # resident blocks upcast before each forward (merge refuses them: fp8 storage)
            policies.append(build_policy({}, 2, stream_dtype="float8_e4m3fn", upcast_resident="off"))
        for policy in policies:
            engine.load(policy)
            for _ in range(2):
                got = np.asarray(engine.generate(FLUX_REQUEST).image)[None]
                assert np.array_equal(got.reshape(expected.shape), expected), policy
            if mode == "merge":  # the streamed fp8 weights took their delta in the upcast's pass
                assert engine._loras_applied.merge.fused_layers > 0, policy
            engine.unload()
    finally:
        engine.close()


@pytest.mark.slow  # one cached plain pipeline per mode, two streamed loads
@pytest.mark.parametrize("mode", ["sidecar", "merge"])
def test_fp8_storage_a_lora_and_a_step_cache_match_the_rounded_cached_pipeline(demo_model_dir: Path,
                                                                                tmp_path: Path, mode: str):
    """A block the cache skips is passed, not filled: merge must not run on it (its bindings hold no
    upcast bytes of it), and the blocks that do run still get their delta after each upcast."""
    from dataclasses import replace

    from omni_console.engine.running.cache_spec import parse_cache

    lora = write_peft_lora(tmp_path / "c.safetensors", demo_model_dir / "transformer", "transformer",
                           pattern=r"attn\.(to_|add_)|ff", seed=8)
    request = replace(FLUX_REQUEST, steps=5, cache=parse_cache("first-block:threshold=0.5"))
    expected = rounded_reference(demo_model_dir, lora, 0.7, mode, request)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(loras=((str(lora), 0.7),), lora_mode=mode))
    try:
        for policy in (build_policy({}, 0, stream_dtype="float8_e4m3fn"),
                       build_policy({}, 1, prefetch_slots=3, stream_dtype="float8_e4m3fn", upcast_resident=1)):
            engine.load(policy)
            got = np.asarray(engine.generate(request).image)[None]
            engine.unload()
            assert np.array_equal(got.reshape(expected.shape), expected), policy
    finally:
        engine.close()
