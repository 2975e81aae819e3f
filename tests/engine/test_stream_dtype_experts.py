"""fp8 storage with two experts (Wan 2.2 A14B, tiny fixture): each expert's blocks are stored in fp8, the
plan counts each expert at its stored bytes, the switch at the boundary step moves fp8 bytes, and every
frame is bit-identical to plain diffusers with `enable_layerwise_casting` on both experts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_families_experts import BOUNDARY_RATIO, EXPERTS_GENERATION, build_tiny_wan22_a14b

from omni_console.engine.engine import Engine
from omni_console.engine.events import ExpertSwitched
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.auto_plan import NothingFits, auto_plan
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.request_profile import RequestSize
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy

PROMPT = "a red fox running in the snow"
FP8 = "float8_e4m3fn"


@pytest.fixture(scope="module")
def wan22_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_wan22_a14b(tmp_path_factory.mktemp("models") / "wan22-a14b", seed=0)


def _request() -> GenerateRequest:
    gen = EXPERTS_GENERATION
    return GenerateRequest(prompt=PROMPT, steps=gen["num_inference_steps"], height=gen["height"], width=gen["width"],
                           seed=3, guidance=3.0, frames=gen["num_frames"],
                           max_sequence_length=gen["max_sequence_length"], output_type="np")


def test_the_plan_counts_each_expert_at_its_fp8_bytes(wan22_dir: Path):
    model = discover_model(wan22_dir)
    full = make_plan(model, build_policy({}, 1, "dlo", "leading", 2))
    fp8 = make_plan(model, build_policy({}, 1, "dlo", "leading", 2, stream_dtype=FP8))
    assert [e.name for e in fp8.experts] == ["transformer", "transformer_2"] and fp8.stream_dtype == FP8
    for e in fp8.experts:
        stored = [b.nbytes for b in fp8.blocks[e.start:e.stop]]
        checkpoint = [b.nbytes for b in full.blocks[e.start:e.stop]]
        assert all(s < 0.5 * c for s, c in zip(stored, checkpoint, strict=True))  # float32 fixture, linears fp8
    ff, f = full.forecast, fp8.forecast
    # the host holds both experts' blocks (fp8), the device one expert's resident block and ring (fp8)
    shrunk = sum(a.nbytes - b.nbytes for a, b in zip(full.blocks, fp8.blocks, strict=True))
    assert ff.pinned_host_bytes - f.pinned_host_bytes == shrunk
    assert f.streamed_bytes_per_forward == max(sum(b.nbytes for b in fp8.blocks[e.start:e.stop] if b.streamed)
                                               for e in fp8.experts)
    assert f.streamed_bytes_per_forward < 0.5 * ff.streamed_bytes_per_forward
    assert f.device_resident_bytes < ff.device_resident_bytes


def test_the_vram_budget_planner_keeps_fp8_storage_and_fits_more_with_it(wan22_dir: Path):
    """A budget that fits one whole expert only in fp8: the planner keeps the policy's stream_dtype and uses it."""
    model = discover_model(wan22_dir)
    per_expert = model.component("transformer").num_blocks
    whole = {dtype: make_plan(model, build_policy({}, per_expert, "dlo", "leading", 2, stream_dtype=dtype))
             for dtype in (None, FP8)}
    budget = whole[FP8].forecast.peak_device_weight_bytes
    assert budget < whole[None].forecast.peak_device_weight_bytes
    size = RequestSize(height=32, width=32, frames=5)
    for dtype, fits_whole in ((FP8, True), (None, False)):
        try:
            chosen = auto_plan(make_plan(model, build_policy({}, 0, stream_dtype=dtype)), budget, size, None,
                               "unknown", None, "unknown")
        except NothingFits:  # full precision may not fit at all: then certainly no whole expert
            assert not fits_whole, dtype
            continue
        own = chosen.plan.experts[0].residency
        assert chosen.plan.stream_dtype == dtype and chosen.forecast.peak_bytes <= budget
        assert (own.num_resident + own.slots == per_expert) == fits_whole, dtype


@pytest.mark.parametrize("device", [
    pytest.param("cpu", marks=pytest.mark.slow),
    pytest.param("cuda", marks=[pytest.mark.cuda,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]),
])
def test_frames_match_diffusers_layerwise_casting_on_both_experts(wan22_dir: Path, wan_loadable, device: str):
    from diffusers import WanPipeline

    req = _request()
    plain = WanPipeline.from_pretrained(wan22_dir, local_files_only=True).to(device)
    assert plain.config.boundary_ratio == BOUNDARY_RATIO
    plain.set_progress_bar_config(disable=True)

    def frames(pipe) -> np.ndarray:
        return pipe(prompt=PROMPT, num_inference_steps=req.steps, height=req.height, width=req.width,
                    guidance_scale=req.guidance, num_frames=req.frames, max_sequence_length=req.max_sequence_length,
                    output_type="np", generator=torch.Generator("cpu").manual_seed(req.seed)).frames[0]

    unchanged = frames(plain)
    for expert in (plain.transformer, plain.transformer_2):
        expert.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=expert.dtype)
    expected = frames(plain)
    assert not np.array_equal(unchanged, expected)  # fp8 storage changes the frames: the check can fail
    del plain
    if device == "cuda":
        torch.cuda.empty_cache()

    copied: dict[str | None, int] = {}
    for stream_dtype in (None, FP8):
        engine = Engine(wan22_dir, device=device)
        engine.load(build_policy({}, 1, "dlo", "leading", 2, stream_dtype=stream_dtype))
        if engine.pipe.config.get("boundary_ratio") is None:  # as tests/engine/test_experts.py
            engine.pipe.register_to_config(boundary_ratio=BOUNDARY_RATIO)
        sub = engine.bus.subscribe()
        result = engine.generate(req)
        switches = [e for e in sub.drain() if isinstance(e, ExpertSwitched)]
        engine.close()
        assert [e.reason for e in switches] == ["boundary", "request end"]
        copied[stream_dtype] = switches[0].copied_bytes
        if stream_dtype == FP8:
            assert np.array_equal(np.stack(result.frames), expected)
        else:
            assert np.array_equal(np.stack(result.frames), unchanged)
    assert 0 < copied[FP8] < 0.5 * copied[None]  # the switch moved the new expert's fp8 bytes
