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
