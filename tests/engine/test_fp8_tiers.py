"""fp8 storage with the blocks in the page cache or on disk (issue 35 item 6).

- `--stream-dtype` over a wider checkpoint (the demo's float32; a real one's bf16): each read brings the file's
  wider bytes and converts them on the host as the load converts pinned blocks, so the output is the pinned
  run's bit for bit, and the bounce ring the plan forecasts holds the read;
- an fp8 checkpoint (as the community's Wan 2.2 ones): the file's bytes are the fp8 ones, read as they are."""

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
    """The read converts the file's wider bytes to fp8 on the host as the load does for pinned blocks: the
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


@pytest.mark.slow
def test_an_fp8_checkpoints_blocks_are_read_from_files_as_stored(demo_model_dir: Path, tmp_path: Path, monkeypatch):
    from test_stream_dtype import fp8_checkpoint

    path = fp8_checkpoint(demo_model_dir, tmp_path / "fp8")
    images, reads = {}, {}
    for tier in ("pinned", "disk"):
        force_tiers(monkeypatch, tier)
        engine = Engine(path, device="cpu")
        try:
            engine.load(build_policy({}, 0))  # no flag: the checkpoint's fp8 is kept
            plan = engine.plan
            assert plan.stream_dtype == "float8_e4m3fn"
            assert all(b.read_nbytes == b.nbytes for b in plan.blocks)  # the file holds what the host would
            s = engine.placement.streamer
            before = s.filler.stats.bytes["disk"] if tier == "disk" else 0
            images[tier] = np.asarray(engine.generate(REQUEST, threading.Event()).image)
            if tier == "disk":
                reads[tier] = s.filler.stats.bytes["disk"] - before
        finally:
            engine.close()
    assert np.array_equal(images["pinned"], images["disk"])
    stored = sum(b.nbytes for b in plan.blocks)
    assert REQUEST.steps * stored * 0.9 <= reads["disk"] <= (REQUEST.steps + 1) * stored * 1.2  # fp8 bytes, not more
