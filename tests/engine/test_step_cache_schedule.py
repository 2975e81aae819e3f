"""TaylorSeer hooked on whole blocks (lite mode): a predicted step runs no block, so the ring copies none of them,
and the output stays bit-identical to the same `enable_cache(config)` on the plain pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_step_cache import _steps_and_copies, demo_request, plain_output

from omni_console.engine.engine import Engine
from omni_console.offload.policy import build_policy

# diffusers' schedule with these values: step 0 computes, then every other step is predicted (0, 1, 0, 1, 0)
LITE = "taylorseer:use_lite_mode=true,disable_cache_before_step=1,cache_interval=2"
PATTERN = [0, 1, 0, 1, 0]


@pytest.mark.slow  # a plain call and three engine requests
def test_lite_taylorseer_is_bit_identical_to_plain_enable_cache(demo_model_dir: Path):
    request = demo_request(LITE)
    expected = plain_output(demo_model_dir, request)
    engine = Engine(demo_model_dir, device="cpu")
    try:
        for policy in (build_policy({}, 0), build_policy({}, 2, placement="spread"),
                       build_policy({}, 1, prefetch_slots=3)):
            engine.load(policy)
            got = np.asarray(engine.generate(request).image)[None]
            engine.unload()
            assert np.array_equal(got.reshape(expected.shape), expected), policy
    finally:
        engine.close()


@pytest.mark.slow  # two requests
def test_a_predicted_step_copies_no_block(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu")
    try:
        engine.load(build_policy({}, 0))
        streamer = engine.placement.streamer
        off, _ = _steps_and_copies(engine, demo_request(None))
        names = streamer.block_names
        total = streamer.region_bytes(names)
        cached, copies = _steps_and_copies(engine, demo_request(LITE))
    finally:
        engine.close()
    assert [s.cache_forwards for s in cached] == [1] * 5 and [s.cache_hits for s in cached] == PATTERN
    assert [(s.skipped_blocks, s.skipped_bytes) for s in cached] == [(h * len(names), h * total) for h in PATTERN]
    assert all(s.sync_fetches == 0 for s in cached)
    # a predicted step moves only the next step's first blocks (the ring's prefetch), never the whole model
    assert all(cached[j].h2d_bytes < total for j in (1, 3)), [s.h2d_bytes for s in cached]
    # steps 2..5 move the bytes of the two steps that run, not four steps' worth
    assert sum(s.h2d_bytes for s in cached[1:]) <= 2 * total < sum(s.h2d_bytes for s in off[1:])


# SeaCache on Wan (text-to-video): a large threshold hits whenever diffusers allows it (its first and last steps
# and every third after two reuses run in full); its leader block is the probe, the rest are never copied on a hit
SEA = "sea:threshold=1000.0"


def _wan_request(cache: str | None):
    from tiny_families import FAMILY_GENERATION

    from omni_console.engine.running.cache_spec import parse_cache
    from omni_console.engine.running.runner import GenerateRequest

    g = FAMILY_GENERATION["wan"]
    return GenerateRequest(prompt="a red fox", steps=6, height=g["height"], width=g["width"], seed=3, guidance=3.0,
                           frames=g["num_frames"], max_sequence_length=g["max_sequence_length"], output_type="np",
                           cache=parse_cache(cache))


@pytest.mark.slow  # a plain call and two engine requests on Wan
def test_seacache_is_followed_by_the_ring_and_bit_identical_to_plain_enable_cache(wan_model_dir: Path,
                                                                                   wan_loadable):
    from diffusers import WanPipeline

    from omni_console.engine.running.step_cache import cache_config

    request = _wan_request(SEA)
    plain = WanPipeline.from_pretrained(wan_model_dir, local_files_only=True)
    plain.set_progress_bar_config(disable=True)
    plain.transformer.enable_cache(cache_config(request.cache, plain))
    expected = plain(**request.call_kwargs(plain)).frames[0]
    engine = Engine(wan_model_dir, device="cpu")
    try:
        engine.load(build_policy({}, 0))
        names = engine.placement.streamer.block_names
        steps, _ = _steps_and_copies(engine, request)
        result_frames = np.stack(engine.generate(request).frames)
    finally:
        engine.close()
    assert np.array_equal(result_frames, expected)
    assert [s.cache_forwards for s in steps] == [2] * 6  # cond and uncond decide apart
    hits = [s.cache_hits for s in steps]
    assert hits[0] == 0 and hits[-1] == 0 and sum(hits) >= 4, hits  # retained first step, full last step
    later = len(names) - 1  # the leader is the probe: copied, it returns the cached residual without running
    assert all(s.skipped_blocks == h * later and s.skipped_bytes > 0 for s, h in zip(steps, hits, strict=True) if h)
    assert all(s.sync_fetches == 0 for s in steps)
