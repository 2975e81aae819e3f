"""`--cache`: diffusers' own step caches on the streamed DiT, bit-identical to the same `enable_cache(config)` on
plain `DiffusionPipeline.from_pretrained(dir)`, with First-Block Cache's skipped blocks never crossing the link."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omni_console.engine.demo.demo_model import DEMO_GENERATION
from omni_console.engine.engine import Engine
from omni_console.engine.events import StepTiming
from omni_console.engine.running.cache_spec import parse_cache
from omni_console.engine.running.runner import GenerateRequest
from omni_console.engine.running.step_cache import cache_config
from omni_console.offload.events import StagingEvent
from omni_console.offload.policy import build_policy

HITS = "first-block:threshold=0.5"  # the demo's hit pattern at seed 3, 5 steps: miss, hit, hit, miss, hit
# MagCache with flat ratios: after its one retained step it skips up to two steps in a row (miss, hit, hit, miss, hit)
MAG = "mag:mag_ratios=[1.0,1.0,1.0,1.0,1.0],num_inference_steps=5,threshold=0.5,max_skip_steps=2"


def demo_request(cache: str | None, steps: int = 5) -> GenerateRequest:
    d = DEMO_GENERATION
    return GenerateRequest(prompt="a red fox", steps=steps, height=64, width=64, seed=3,
                           guidance=float(d["guidance_scale"]), extra={"max_sequence_length": d["max_sequence_length"]},
                           output_type="np", cache=parse_cache(cache))


def plain_output(path: Path, request: GenerateRequest) -> np.ndarray:
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    if request.cache is not None:
        pipe.transformer.enable_cache(cache_config(request.cache, pipe))
    return np.asarray(pipe(**request.call_kwargs(pipe)).images)


@pytest.mark.slow  # a plain call and four engine requests per kind
@pytest.mark.parametrize("cache", [HITS, "first-block:threshold=0", "mag", MAG, "taylorseer:cache_interval=2",
                                   "pab:spatial_attention_block_skip_range=2", "off"])
def test_cached_output_is_bit_identical_to_plain_enable_cache(demo_model_dir: Path, cache: str):
    request = demo_request(cache)
    expected = plain_output(demo_model_dir, request)
    engine = Engine(demo_model_dir, device="cpu")
    policies = [build_policy({}, 0), build_policy({}, 2, placement="spread"), build_policy({}, 1, prefetch_slots=3),
                build_policy({}, 0, mode="resident")]
    try:
        for policy in policies:
            engine.load(policy)
            got = np.asarray(engine.generate(request).image)[None]
            engine.unload()
            assert np.array_equal(got.reshape(expected.shape), expected), (cache, policy)
    finally:
        engine.close()


def _steps_and_copies(engine: Engine, request: GenerateRequest) -> tuple[list[StepTiming], list[list[str]]]:
    """Each step's timing and the blocks staged during it."""
    sub = engine.bus.subscribe()
    engine.generate(request)
    steps: list[StepTiming] = []
    copies: list[list[str]] = [[]]
    for e in sub.drain():
        if isinstance(e, StagingEvent):
            copies[-1].append(e.target)
        elif isinstance(e, StepTiming):
            steps.append(e)
            copies.append([])
    return steps, copies[1:-1]  # copies[k]: staged between step k+1's end and step k+2's


@pytest.mark.slow  # two requests
def test_a_skipped_block_never_crosses_the_link(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu")
    try:
        engine.load(build_policy({}, 0))
        streamer = engine.placement.streamer
        off, _ = _steps_and_copies(engine, demo_request(None))
        names = streamer.block_names  # in the order the first forward ran them: the head (probe) block first
        regions = {n: streamer.region_bytes([n]) for n in names}
        head = names[0]
        cached, copies = _steps_and_copies(engine, demo_request(HITS))
    finally:
        engine.close()
    total = sum(regions.values())
    assert [s.h2d_bytes for s in off[1:]] == [total] * 4  # uncached: every block crosses every step
    hits = [s.cache_hits for s in cached]
    assert [s.cache_forwards for s in cached] == [1] * 5 and hits == [0, 1, 1, 0, 1]
    later = total - regions[head]
    assert [(s.skipped_blocks, s.skipped_bytes) for s in cached] == [(h * (len(names) - 1), h * later) for h in hits]
    # a hit after a hit: nothing crosses (the head stays in its slot); in any step that hits only the head may be
    # staged (copies[j - 2]: step j's), and no block is ever fetched synchronously
    assert cached[2].h2d_bytes == 0
    assert all(set(copies[j - 2]) <= {head} for j in range(2, 6) if hits[j - 1]), copies
    assert all(s.sync_fetches == 0 for s in cached)
    # steps 2..5 move no more than the bytes of the blocks they run (a head kept in its slot is not copied again)
    ran = sum(regions[head] + (0 if h else later) for h in hits[1:])
    assert sum(s.h2d_bytes for s in cached[1:]) <= ran < sum(s.h2d_bytes for s in off[1:])


def test_cache_off_and_no_flag_run_no_cache():
    assert parse_cache(None) is None and parse_cache("off") is None and parse_cache(" OFF ") is None
    assert demo_request("off").cache is None


@pytest.mark.slow  # one request
def test_the_staging_log_shows_each_run_of_skipped_blocks_once(demo_model_dir: Path):
    from omni_console.console.event_text import format_event
    from omni_console.engine.events import BlocksSkipped

    engine = Engine(demo_model_dir, device="cpu")
    try:
        engine.load(build_policy({}, 0))
        engine.generate(demo_request(None))  # the block order, as the first forward ran it
        names = engine.placement.streamer.block_names
        sub = engine.bus.subscribe()
        engine.generate(demo_request(HITS))
        events = sub.drain()
    finally:
        engine.close()
    skips = [e for e in events if isinstance(e, BlocksSkipped)]
    assert [(e.first, e.last, e.blocks) for e in skips] == [(names[1], names[-1], len(names) - 1)] * 3  # 3 hits
    lines = [format_event(e, on_cpu=True) for e in skips]
    assert all(f"SKIP {names[1]} .. {names[-1]}  {len(names) - 1} blocks, " in line for line in lines)
    assert all(line.endswith("not copied (step cache hit)") for line in lines)


@pytest.mark.slow  # one request
def test_magcache_skips_are_followed_too(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu")
    try:
        engine.load(build_policy({}, 0))
        steps, _ = _steps_and_copies(engine, demo_request(MAG))
        names = engine.placement.streamer.block_names
    finally:
        engine.close()
    assert [s.cache_hits for s in steps] == [0, 1, 1, 0, 1]
    assert [s.skipped_blocks for s in steps] == [0, len(names) - 1, len(names) - 1, 0, len(names) - 1]
    assert steps[2].h2d_bytes == 0 and all(s.sync_fetches == 0 for s in steps)
