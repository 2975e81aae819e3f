"""The whole-request forecast: placements and ring depths stay exact through the engine, a request
leaves a cached profile, and the next forecast of that size says "cached" and checks itself."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pytest
from tiny_families import FAMILY_GENERATION

from omni_console.engine.engine import Engine
from omni_console.engine.events import ForecastCheck
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.model_configs import fill_size
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.request_forecast import forecast_request
from omni_console.engine.planning.request_profile import RequestProfile, RequestSize, load_profile, profile_dir
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.events import EventBus
from omni_console.offload.policy import build_policy

DEMO_BLOCKS = 6


def _request(seed: int = 3) -> GenerateRequest:
    gen = dict(FAMILY_GENERATION["flux"])
    steps, height, width = gen.pop("num_inference_steps"), gen.pop("height"), gen.pop("width")
    return GenerateRequest(prompt="a red fox in snow", steps=steps, height=height, width=width, seed=seed, extra=gen)


@pytest.fixture(scope="module")
def plain_output(demo_model_dir: Path) -> np.ndarray:
    import diffusers

    pipe = diffusers.FluxPipeline.from_pretrained(demo_model_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return np.asarray(pipe(**_request().call_kwargs(pipe)).images[0])


@pytest.mark.slow
@pytest.mark.parametrize(("placement", "resident", "slots"), [("spread", 3, 2), ("spread", 2, 4), ("leading", 1, 5),
                                                              ("leading", 0, 3)])
def test_every_placement_and_depth_matches_plain_diffusers(demo_model_dir, plain_output, placement, resident, slots):
    engine = Engine(demo_model_dir, device="cpu")
    try:
        engine.load(build_policy({"default": True}, resident, "dlo", placement, slots))
        streamer = engine.placement.streamer
        assert streamer.residency.placement == placement and streamer.num_slots == min(slots, DEMO_BLOCKS - resident)
        assert np.array_equal(np.asarray(engine.generate(_request()).image), plain_output)
    finally:
        engine.close()


def test_a_request_caches_its_profile_and_the_next_forecast_uses_it(demo_model_dir: Path):
    for old in profile_dir().glob("*.json") if profile_dir().is_dir() else []:
        old.unlink()
    bus = EventBus()
    sub = bus.subscribe()
    engine = Engine(demo_model_dir, device="cpu", bus=bus)
    request = _request()
    size = RequestSize(height=request.height, width=request.width)
    try:
        engine.load(build_policy({}, 2, "dlo", "spread", 3))
        before = engine.forecast(size)
        assert before.step_s is None and before.step_source == "unknown"
        first = engine.generate(request)
        assert first.check is not None and first.check.predicted_step_s is None and first.check.measured_step_s > 0
        # cached under the size the pipeline rendered: the fields left out take the pipeline's defaults
        profile = load_profile(demo_model_dir, engine.model.nbytes, "cpu", fill_size(engine.model, size))
        assert profile is not None and profile.size.guidance is not None and len(profile.block_compute_s) == DEMO_BLOCKS
        assert all(c > 0 for c in profile.block_compute_s) and profile.forwards_per_step == 1
        steady = first.steps[1:] or first.steps  # the first step runs cold and is left out
        busy = statistics.median(s.wall_s - s.stall_s for s in steady)  # one forward per step
        assert sum(profile.block_compute_s) + profile.other_s == pytest.approx(busy)
        after = engine.forecast(size)
        assert after.step_source == "cached" and after.step_s > 0
        second = engine.generate(request)
        checks = [e for e in sub.drain() if isinstance(e, ForecastCheck)]
        assert [c.request_id for c in checks] == [first.request_id, second.request_id]
        assert checks[-1].predicted_step_s == pytest.approx(after.step_s)
        assert checks[-1].step_error is not None and checks[-1].measured_peak is None  # no allocator on a CPU
        # another size is estimated from the newest profile (the second request's), scaled by its FLOPs
        now = engine.forecast(size)
        other = engine.forecast(RequestSize(height=request.height * 2, width=request.width * 2))
        assert other.step_source == "estimated" and other.step_s > now.step_s
        assert other.step_basis == f"scaled from {size.label()}"
    finally:
        engine.close()


def _profile(**kw) -> RequestProfile:
    base = dict(model="/m", model_bytes=1, device="d", size=RequestSize(height=64, width=64),
                block_compute_s=[0.01] * DEMO_BLOCKS, other_s=0.001, forwards_per_step=1, text_extra_bytes=1000,
                denoise_extra_bytes=5000, decode_extra_bytes=9000, bandwidth_bytes_per_s=1e9,
                measured_at="2026-11-30T00:00:00")
    return RequestProfile(**(base | kw))


def test_peak_is_the_largest_phase_with_the_staged_components_it_brings(demo_model_dir: Path):
    model = discover_model(demo_model_dir)
    plan = make_plan(model, build_policy({}, 0, "dlo", "leading", 2))
    f = forecast_request(plan, RequestSize(height=64, width=64), _profile(), "cached", 1e9, "cached")
    base = plan.forecast.device_resident_bytes + 2 * plan.forecast.largest_streamed_block_bytes
    vae = max(c.info.nbytes for c in plan.components if c.info.role == "vae")
    encoder = max(c.info.nbytes for c in plan.components if c.info.role == "encoder")
    assert f.phase_peaks == {"text_encoding": base + encoder + 1000, "denoise": base + 5000,
                             "vae_decode": base + vae + 9000}
    assert f.peak_bytes == max(f.phase_peaks.values()) and f.peak_source == "cached"
    resident = make_plan(model, build_policy({"default": False}, 0))
    g = forecast_request(resident, RequestSize(height=64, width=64), _profile(), "cached", 1e9, "cached")
    assert g.phase_peaks["vae_decode"] == resident.forecast.device_resident_bytes + 2 * \
        resident.forecast.largest_streamed_block_bytes + 9000  # a resident VAE is already in the weights


