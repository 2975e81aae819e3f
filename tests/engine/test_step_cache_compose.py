"""`--cache` composes with the other policies: fp8 storage (with resident blocks kept upcast) against plain diffusers'
layerwise casting plus the same cache, and a live re-plan between two cached requests."""

from __future__ import annotations

from pathlib import Path

import diffusers
import numpy as np
import pytest
import torch
from test_step_cache import HITS, demo_request

from omni_console.engine.engine import Engine
from omni_console.engine.events import StepTiming
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.step_cache import cache_config
from omni_console.offload.policy import build_policy

pytestmark = pytest.mark.slow  # plain calls and several engine requests


def _plain_fp8_cached(path: Path, request) -> np.ndarray:
    pipe = diffusers.FluxPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    pipe.transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    pipe.transformer.enable_cache(cache_config(request.cache, pipe))
    return np.asarray(pipe(**request.call_kwargs(pipe)).images)


def test_fp8_storage_and_kept_upcast_blocks_match_layerwise_casting_with_the_cache(demo_model_dir: Path):
    request = demo_request(HITS)
    expected = _plain_fp8_cached(demo_model_dir, request)
    engine = Engine(demo_model_dir, device="cpu")
    sub = engine.bus.subscribe()
    try:
        for layers, placement, upcast in ((0, "leading", "off"), (2, "spread", "off"), (2, "leading", "2")):
            engine.load(build_policy({}, layers, "dlo", placement, stream_dtype="float8_e4m3fn",
                                     upcast_resident=upcast))
            got = np.asarray(engine.generate(request).image)[None]
            engine.unload()
            assert np.array_equal(got.reshape(expected.shape), expected), (layers, placement, upcast)
    finally:
        engine.close()
    steps = [e for e in sub.drain() if isinstance(e, StepTiming)]
    assert sum(s.cache_hits for s in steps) > 0 and sum(s.skipped_bytes for s in steps) > 0  # the cache acted


def test_a_live_replan_between_cached_requests_keeps_the_ring_following(demo_model_dir: Path):
    request = demo_request(HITS)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=True))
    sub = engine.bus.subscribe()
    try:
        engine.load(build_policy({}, 0))
        first = np.asarray(engine.generate(request).image)
        engine.replan(build_policy({}, 2, "dlo", "spread", 3))  # other resident blocks, a deeper ring
        second = np.asarray(engine.generate(request).image)
    finally:
        engine.close()
    assert np.array_equal(first, second)
    steps = [e for e in sub.drain() if isinstance(e, StepTiming)]
    assert len(steps) == 10 and all(s.sync_fetches == 0 for s in steps)
    after = steps[5:]
    assert all(s.skipped_blocks > 0 for s in after if s.cache_hits)  # the re-planned ring still skips
    assert sum(s.skipped_blocks for s in after) < sum(s.skipped_blocks for s in steps[:5])  # fewer streamed now


def test_a_cache_that_fails_mid_request_leaves_nothing_behind(demo_model_dir: Path):
    """FasterCache on the guidance-distilled demo fails at its first block as plain diffusers does; the engine is
    ready again, the cache is off the DiT, the ring follows nothing, and the next request is the uncached one."""
    from test_step_cache import plain_output

    engine = Engine(demo_model_dir, device="cpu")
    try:
        engine.load(build_policy({}, 0))
        with pytest.raises(IndexError):
            engine.generate(demo_request("faster"))
        assert not engine.pipe.transformer.is_cache_enabled
        assert engine.placement.streamer.ring.skip is None
        got = np.asarray(engine.generate(demo_request(None)).image)[None]
    finally:
        engine.close()
    expected = plain_output(demo_model_dir, demo_request(None))
    assert np.array_equal(got.reshape(expected.shape), expected)
