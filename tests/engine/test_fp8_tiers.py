"""fp8 storage (`--stream-dtype`) of a 16-bit checkpoint with its blocks in the page cache or on disk (issue 35
item 6): each read brings the file's 16-bit bytes and converts them on the host as the load converts pinned
blocks, so the output is the pinned run's bit for bit, and the bounce ring the plan forecasts holds the read."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest

from omni_console.engine import engine as engine_module
from omni_console.engine.engine import Engine
from omni_console.engine.planning.host_forecast import host_forecast
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy
from omni_console.offload.tiers import HostTiers, Tier

REQUEST = GenerateRequest(prompt="a red fox in the snow", steps=2, height=64, width=64, seed=7, guidance=3.0,
                          output_type="np")


def force_tiers(monkeypatch: pytest.MonkeyPatch, tier: Tier) -> None:
    """Every plan the engine makes gets this tier for every block (tests/engine/test_tier_reads.py's way)."""
    make = engine_module.make_plan

    def with_tiers(model, policy, *args, **kwargs):
        plan = make(model, policy, *args, **kwargs)
        return dataclasses.replace(plan, tiers=HostTiers(blocks=(tier,) * len(plan.blocks)))

    monkeypatch.setattr(engine_module, "make_plan", with_tiers)


@pytest.mark.slow
def test_fp8_blocks_read_from_files_are_the_pinned_ones_bits_and_the_ring_holds_the_read(demo_model_dir: Path,
                                                                                          monkeypatch):
    """The read converts the file's 16-bit bytes to fp8 on the host as the load does for pinned blocks: the
    image is the pinned run's, bit for bit; each forward reads the file's bytes; the bounce ring the plan
    forecasts holds the streamer's."""
    images, reads = {}, {}
    for tier in ("pinned", "page_cache", "disk"):
        force_tiers(monkeypatch, tier)
        engine = Engine(demo_model_dir, device="cpu")
        try:
            engine.load(build_policy({}, 0, stream_dtype="float8_e4m3fn"))
            s = engine.placement.streamer
            if tier != "pinned":
                assert s.bounce_bytes <= host_forecast(engine.plan).part("bounce ring")
                before = s.filler.stats.bytes[tier]
            images[tier] = np.asarray(engine.generate(REQUEST, threading.Event()).image)
            if tier != "pinned":
                reads[tier] = s.filler.stats.bytes[tier] - before
            plan = engine.plan
        finally:
            engine.close()
    assert np.array_equal(images["pinned"], images["disk"]) and np.array_equal(images["pinned"], images["page_cache"])
    in_files = sum(b.read_nbytes for b in plan.blocks)
    for tier, n in reads.items():  # whole forwards of the file's bytes (each read widened to whole pages)
        assert n >= REQUEST.steps * in_files * 0.9, tier
