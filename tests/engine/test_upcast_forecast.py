"""fp8 storage in the forecasts (engine/planning/upcast_cost.py): each block's upcast time (its fp8 elements, as the
arena really holds them, over the device's conversion rate) is added to its compute, and the upcast
scratch to every peak; the `--vram-budget` planner counts both."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_console.engine.engine import Engine
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.auto_plan import auto_plan
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.request_forecast import dit_profile, forecast_request
from omni_console.engine.planning.request_profile import RequestProfile, RequestSize
from omni_console.engine.planning.upcast_cost import upcast_rate
from omni_console.offload.policy import build_policy
from omni_console.offload.upcast import is_float8

SIZE = RequestSize(height=64, width=64)
FP8 = "float8_e4m3fn"


def _profile(blocks: int, device: str, compute: float = 1e-3) -> RequestProfile:
    return RequestProfile(model="/m", model_bytes=1, device=device, size=SIZE, block_compute_s=[compute] * blocks,
                          other_s=compute, forwards_per_step=1, text_extra_bytes=0, denoise_extra_bytes=1000,
                          decode_extra_bytes=0, bandwidth_bytes_per_s=1e8, measured_at="2026-12-01T00:00:00")


@pytest.mark.slow
@pytest.mark.parametrize("modulation", [False, True])
def test_the_plans_upcast_elements_are_the_arenas(demo_model_dir: Path, modulation: bool):
    """The header forecast of each block's fp8 elements equals what the loaded streamer upcasts."""
    policy = build_policy({}, 0, stream_dtype=FP8, fp8_modulation=modulation)
    plan = make_plan(discover_model(demo_model_dir), policy)
    engine = Engine(demo_model_dir, device="cpu")
    try:
        engine.load(policy)
        arena = []
        for b in engine.placement.streamer._blocks:
            n = 0
            for x in b.bindings:
                if is_float8(x.dtype):
                    size = 1
                    for d in x.shape:
                        size *= d
                    n += size
            arena.append(n)
    finally:
        engine.close()
    assert [b.upcast_elems for b in plan.blocks] == arena and all(arena)
    plain = make_plan(discover_model(demo_model_dir), build_policy({}, 0))
    assert not any(b.upcast_elems for b in plain.blocks)


@pytest.mark.parametrize("device", ["cpu", "NVIDIA H200"])
def test_each_blocks_compute_gains_its_upcast(demo_model_dir: Path, device: str):
    model = discover_model(demo_model_dir)
    fp8, plain = make_plan(model, build_policy({}, 0, stream_dtype=FP8)), make_plan(model, build_policy({}, 0))
    profile = _profile(len(plain.blocks), device)
    base, with_upcast = dit_profile(plain, profile), dit_profile(fp8, profile)
    assert base is not None and with_upcast is not None
    assert base.compute_s == tuple(profile.block_compute_s)  # full precision: nothing added
    for c, b in zip(with_upcast.compute_s, fp8.blocks, strict=True):
        assert c == pytest.approx(1e-3 + b.upcast_elems / upcast_rate(device), rel=1e-9)
    assert upcast_rate("cpu") < upcast_rate(device) or device == "cpu"
    f_plain = forecast_request(plain, SIZE, profile, "cached", 1e8, "measured", overlap=device != "cpu")
    f_fp8 = forecast_request(fp8, SIZE, profile, "cached", 1e8, "measured", overlap=device != "cpu")
    assert f_fp8.step_s is not None and f_plain.step_s is not None
    # the peak's weights are at fp8 bytes plus one scratch for the running block's upcast
    w = fp8.forecast
    weights = w.device_resident_bytes + w.streaming_slots * w.largest_streamed_block_bytes + w.upcast_scratch_bytes
    assert w.upcast_scratch_bytes > 0 and f_fp8.phase_peaks["denoise"] == weights + 1000


def test_the_budget_planner_counts_the_upcast_scratch(demo_model_dir: Path):
    """The smallest policy's forecast peak (every block streamed, 2 slots, all staged) fits; that
    peak less the scratch does not: the planner counts the scratch as the forecast does."""
    from omni_console.engine.planning.auto_plan import NothingFits

    model = discover_model(demo_model_dir)
    fp8 = make_plan(model, build_policy({}, 0, stream_dtype=FP8))
    profile = _profile(len(fp8.blocks), "NVIDIA H200")
    # the planner packs slots at the 256-byte alignment: at most 2 x 255 bytes above the forecast
    peak = forecast_request(fp8, SIZE, profile, "cached", 1e8, "measured").peak_bytes + 2 * 255
    assert fp8.forecast.upcast_scratch_bytes > 10 * 255
    chosen = auto_plan(fp8, peak, SIZE, profile, "cached", 1e8, "measured")
    assert chosen.forecast.peak_bytes <= peak and chosen.plan.forecast.upcast_scratch_bytes > 0
    with pytest.raises(NothingFits):
        auto_plan(fp8, peak - fp8.forecast.upcast_scratch_bytes, SIZE, profile, "cached", 1e8, "measured")
