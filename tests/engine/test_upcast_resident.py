"""fp8 storage, resident blocks kept upcast (`--upcast-resident`): converted once at load, bit-identical
to diffusers' layerwise casting (resident) for mixed policies, live re-plans between the two states,
and the device holding the compute dtype's bytes for exactly the blocks the plan names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_engine import pipeline_image, request_for
from test_stream_dtype import reference_image

from omni_console.engine.engine import Engine
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.options import EngineOptions
from omni_console.engine.planning.plan import make_plan
from omni_console.offload.errors import PolicyError
from omni_console.offload.policy import build_policy
from omni_console.offload.upcast import is_float8

FP8 = "float8_e4m3fn"


def _block_dtypes(engine: Engine) -> list[set[torch.dtype]]:
    """Each DiT block's parameter dtypes as they sit on the device between requests."""
    streamer = engine.placement.streamer  # type: ignore[union-attr]
    return [{p.dtype for p in b.module.parameters() if p.numel()} for b in streamer._blocks]


@pytest.mark.slow
@pytest.mark.parametrize("live", [False, True])
def test_mixed_policies_match_diffusers_layerwise_casting(demo_model_dir: Path, live: bool):
    req = request_for("flux")
    expected = reference_image(demo_model_dir, req)
    n = discover_model(demo_model_dir).num_dit_blocks
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=live))
    # (resident blocks, placement, kept upcast): some upcast + some resident fp8 + some streamed; all upcast
    for layers, placement, upcast in ((2, "leading", 1), (3, "spread", 2), (n, "leading", n), (n - 1, "leading", 1)):
        policy = build_policy({}, layers, "dlo", placement, stream_dtype=FP8, upcast_resident=upcast)
        engine.load(policy)
        plan = engine.plan
        assert plan is not None and plan.residency.num_upcast == min(upcast, layers)
        kept = plan.residency.upcast_flags
        for flag, dtypes in zip(kept, _block_dtypes(engine), strict=True):
            if flag:  # converted once: no float8 left on the device for it
                assert not any(is_float8(d) for d in dtypes)
        got = np.asarray(engine.generate(req).image)
        assert np.array_equal(got, expected), (layers, placement, upcast)
        engine.unload()
    engine.close()


@pytest.mark.slow
def test_live_replan_changes_the_upcast_blocks(demo_model_dir: Path):
    req = request_for("flux")
    expected = reference_image(demo_model_dir, req)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=True))
    policy = build_policy({}, 3, stream_dtype=FP8)
    engine.load(policy)
    fp8_bytes = engine.placement.streamer.resident_bytes  # type: ignore[union-attr]
    engine.replan(policy.model_copy(update={"upcast_resident": 2}))
    up = engine.placement.streamer  # type: ignore[union-attr]
    assert up.residency.num_upcast == 2 and up.resident_bytes > fp8_bytes
    assert [any(is_float8(d) for d in ds) for ds in _block_dtypes(engine)][:3] == [False, False, True]
    assert np.array_equal(np.asarray(engine.generate(req).image), expected)
    engine.replan(policy)  # back to every resident block fp8
    assert engine.placement.streamer.resident_bytes == fp8_bytes  # type: ignore[union-attr]
    assert np.array_equal(np.asarray(engine.generate(req).image), expected)
    engine.close()


def test_plan_counts_upcast_blocks_at_the_compute_dtype(demo_model_dir: Path):
    model = discover_model(demo_model_dir)
    fp8 = make_plan(model, build_policy({}, 3, stream_dtype=FP8))
    up = make_plan(model, build_policy({}, 3, stream_dtype=FP8, upcast_resident=2))
    kept = [b for b in up.blocks if b.kept_upcast]
    assert [b.index for b in kept] == [b.index for b in up.blocks if not b.streamed][:2]
    extra = sum(b.upcast_elems for b in kept) * 3  # the demo computes in float32: 3 more bytes per fp8 element
    assert extra > 0 and all(b.upcast_extra_bytes == b.upcast_elems * 3 for b in kept)
    assert up.forecast.device_resident_bytes == fp8.forecast.device_resident_bytes + extra
    assert up.forecast.pinned_host_bytes == fp8.forecast.pinned_host_bytes  # the host keeps fp8
    assert up.forecast.streamed_bytes_per_forward == fp8.forecast.streamed_bytes_per_forward
    assert all(b.forward_upcast_elems == 0 for b in kept)
    # every resident block upcast and nothing streamed: no per-forward upcast, no scratch
    n = model.num_dit_blocks
    whole = make_plan(model, build_policy({}, n, stream_dtype=FP8, upcast_resident=n))
    assert whole.forecast.upcast_scratch_bytes == 0 and fp8.forecast.upcast_scratch_bytes > 0


def test_bad_values_are_refused_before_load(demo_model_dir: Path):
    model = discover_model(demo_model_dir)
    with pytest.raises(PolicyError, match="needs fp8 storage"):
        make_plan(model, build_policy({}, 2, upcast_resident=1))
    with pytest.raises(PolicyError, match=">= 0"):
        build_policy({}, 2, stream_dtype=FP8, upcast_resident=-1)
    with pytest.raises(PolicyError, match="auto, off or a number"):
        build_policy({}, 2, stream_dtype=FP8, upcast_resident="some")
    with pytest.raises(PolicyError, match="mode=dlo"):
        build_policy(None, 0, "resident", stream_dtype=FP8, upcast_resident=1)
    # a count above the resident blocks keeps all of them upcast (the policy survives fewer resident layers)
    assert make_plan(model, build_policy({}, 1, stream_dtype=FP8, upcast_resident=5)).residency.num_upcast == 1


@pytest.mark.slow
@pytest.mark.parametrize("family,fixture,pipeline_name", [
    ("sd3", "sd3_model_dir", "StableDiffusion3Pipeline"),
    ("wan", "wan_model_dir", "WanPipeline"),
])
def test_tiny_families_keep_upcast_blocks_bit_identical(request, family, fixture, pipeline_name, wan_loadable):
    """Each family's own skip patterns and float32 modules (Wan's) stay as diffusers casts them."""
    import diffusers

    path: Path = request.getfixturevalue(fixture)
    req = request_for(family)

    pipe = getattr(diffusers, pipeline_name).from_pretrained(path, local_files_only=True)
    pipe.transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=pipe.transformer.dtype)
    expected = pipeline_image(pipe, req)
    engine = Engine(path, device="cpu")
    for layers, upcast in ((2, 1), (1, 1)):  # some upcast, some resident fp8, some streamed; upcast + streamed
        engine.load(build_policy({}, layers, stream_dtype=FP8, upcast_resident=upcast))
        assert engine.plan is not None and engine.plan.residency.num_upcast == upcast
        assert np.array_equal(np.asarray(engine.generate(req).image), expected), (family, layers, upcast)
        engine.unload()
    engine.close()


def test_out_of_memory_first_puts_upcast_blocks_back_to_fp8(demo_model_dir: Path):
    from omni_console.engine.running.oom_guard import device_weights, lower_policy

    model = discover_model(demo_model_dir)
    plan = make_plan(model, build_policy({}, 3, stream_dtype=FP8, upcast_resident=2))
    lower = lower_policy(plan, "denoise")
    assert lower is not None and "kept upcast 2→0" in lower[1]
    new = make_plan(model, lower[0])
    assert new.residency.num_upcast == 0 and new.residency.num_resident == 3
    assert device_weights(new) < device_weights(plan)
