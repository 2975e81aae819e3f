"""Soak: 200 generations with a reload every 10 leave memory, threads and file descriptors flat.

A console stays open for hours; anything that grows per request or per load (a cached pipeline,
a hook left on a module, an arena never closed, a thread per load) shows up here as growth after
the warm-up. The bounds are stated in the assertions.
"""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import psutil
import pytest

from omni_console.engine.engine import Engine
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy

pytestmark = pytest.mark.slow  # end to end (200 generations): .ci/run runs it, `pytest -q` skips it

GENERATIONS = 200
RELOAD_EVERY = 10
WARMUP = 20
RSS_GROWTH_BOUND = 40 * 2**20  # after warm-up: allocator noise, never a model-sized (4 MB) leak per load


def _reading(proc: psutil.Process) -> tuple[int, int, int]:
    gc.collect()
    return proc.memory_info().rss, threading.active_count(), proc.num_fds()


def test_two_hundred_generations_with_reloads_stay_flat(demo_model_dir: Path):
    proc = psutil.Process()
    engine = Engine(demo_model_dir, device="cpu")
    policies = [build_policy({}, 0), build_policy({"vae": False}, 2), build_policy({"default": False}, 6)]
    request = GenerateRequest(prompt="a red fox", steps=1, height=64, width=64, seed=1,
                              extra={"max_sequence_length": 32})
    first_image = None
    baseline = None
    rss_after: list[int] = []
    for i in range(GENERATIONS):
        if i % RELOAD_EVERY == 0:
            if i:
                engine.unload()
            engine.load(policies[(i // RELOAD_EVERY) % len(policies)])
        image = engine.generate(request).image
        if first_image is None:
            first_image = image.tobytes()
        assert image.tobytes() == first_image, f"generation {i} differs"
        if i + 1 == WARMUP:
            baseline = _reading(proc)
        elif i + 1 > WARMUP and (i + 1) % RELOAD_EVERY == 0:
            rss, threads, fds = _reading(proc)
            rss_after.append(rss)
            assert threads == baseline[1], f"threads grew from {baseline[1]} to {threads} after {i + 1} generations"
            assert fds <= baseline[2] + 2, f"file descriptors grew from {baseline[2]} to {fds} after {i + 1}"
    engine.close()
    assert baseline is not None
    growth = max(rss_after) - baseline[0]
    print(f"\nsoak: RSS {baseline[0] / 2**20:.0f} MiB after warm-up, max growth {growth / 2**20:.1f} MiB; "
          f"threads {baseline[1]}; fds {baseline[2]}")
    assert growth < RSS_GROWTH_BOUND, f"RSS grew {growth / 2**20:.1f} MiB over {GENERATIONS - WARMUP} generations"
