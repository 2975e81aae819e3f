"""`--cache` with two experts (Wan 2.2 A14B): each expert has its own diffusers cache state, as plain diffusers
gives it when the config is enabled on both transformers, so the first step after the boundary starts afresh (a
miss) on the second expert; the output is bit-identical to that plain pipeline, and hit steps copy nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_families_experts import BOUNDARY_RATIO, EXPERTS_GENERATION, build_tiny_wan22_a14b

from omni_console.engine.engine import Engine
from omni_console.engine.events import ExpertSwitched, StepTiming
from omni_console.engine.running.cache_spec import parse_cache
from omni_console.engine.running.runner import GenerateRequest
from omni_console.engine.running.step_cache import cache_config
from omni_console.offload.policy import build_policy

pytestmark = pytest.mark.slow  # a plain call and an engine request on the two-expert family

CACHE = "first-block:threshold=0.3"  # at seed 3, 6 steps, guidance 3: every step but each expert's first hits


def _request() -> GenerateRequest:
    g = EXPERTS_GENERATION
    return GenerateRequest(prompt="a red fox", steps=6, height=g["height"], width=g["width"], seed=3, guidance=3.0,
                           frames=g["num_frames"], max_sequence_length=g["max_sequence_length"], output_type="np",
                           cache=parse_cache(CACHE))


def test_each_expert_starts_its_cache_afresh_and_matches_plain_diffusers(tmp_path: Path, wan_loadable):
    from diffusers import WanPipeline

    path = build_tiny_wan22_a14b(tmp_path / "wan22", seed=0)
    req = _request()
    plain = WanPipeline.from_pretrained(path, local_files_only=True)
    plain.set_progress_bar_config(disable=True)
    for expert in (plain.transformer, plain.transformer_2):
        expert.enable_cache(cache_config(req.cache, plain))
    expected = plain(**req.call_kwargs(plain)).frames[0]
    engine = Engine(path, device="cpu")
    try:
        engine.load(build_policy({}, 0, "dlo", "leading", 2))
        if engine.pipe.config.get("boundary_ratio") is None:  # as tests/engine/test_experts.py loads it
            engine.pipe.register_to_config(boundary_ratio=BOUNDARY_RATIO)
        sub = engine.bus.subscribe()
        result = engine.generate(req)
        events = sub.drain()
    finally:
        engine.close()
    assert np.array_equal(np.stack(result.frames), expected)
    steps = [e for e in events if isinstance(e, StepTiming)]
    boundary = next(i for i, e in enumerate(events) if isinstance(e, ExpertSwitched))
    first_low = sum(1 for e in events[:boundary] if isinstance(e, StepTiming)) + 1  # the second expert's first step
    assert [s.cache_forwards for s in steps] == [2] * 6  # cond and uncond decide apart
    assert steps[0].cache_hits == 0 and steps[first_low - 1].cache_hits == 0  # each expert's state starts empty
    hit_steps = [s for s in steps if s.cache_hits == 2]
    assert len(hit_steps) >= 3 and all(s.skipped_blocks == 4 and s.h2d_bytes == 0 for s in hit_steps)
    assert all(s.sync_fetches == 0 for s in steps)
