"""Issue 35 "no waste": `run --vram-budget` loads with live re-plan masters (an out-of-memory step-down may move
resident blocks), but keeps no host copy of what the device holds: a resident block's and a resident encoder's/VAE's
master is its file (engine/planning/run_masters.py). The host then holds what the plan names (the streamed blocks and
the staged masters), the host forecast says so, and a step-down still works and gives an unfaulted run's output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_oom_step_down import DEVICES, POLICY, REQUEST, OomAt, clean_image, inside, same_image

from omni_console.engine.engine import Engine
from omni_console.engine.events import OomStepDown
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.options import EngineOptions
from omni_console.engine.planning.host_forecast import PINNED_PARTS, host_forecast
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.run_masters import masters_in_files
from omni_console.offload.file_stager import FileStager
from omni_console.offload.policy import build_policy

PAGE = 4096


def pinned_share(plan, live: bool) -> int:
    forecast = host_forecast(plan, live_replan=live)
    return sum(forecast.part(name) for name in PINNED_PARTS)


def test_the_plan_keeps_resident_masters_in_files_and_the_forecast_pins_what_the_plan_names(demo_model_dir: Path):
    plan = make_plan(discover_model(demo_model_dir), POLICY)
    filed = masters_in_files(plan)
    resident = [i for i, b in enumerate(plan.blocks) if not b.streamed]
    assert len(resident) == 4
    assert [filed.tiers.block(i) for i in resident] == ["page_cache"] * 4
    assert all(filed.tiers.block(i) == "pinned" for i, b in enumerate(plan.blocks) if b.streamed)
    assert dict(filed.tiers.components) == {"vae": "page_cache"}  # the resident VAE; staged encoders stay pinned
    whole = pinned_share(plan, live=True)  # pinned masters of everything: the waste
    assert pinned_share(filed, live=True) == plan.forecast.pinned_host_bytes < whole
    wasted = sum(plan.blocks[i].nbytes for i in resident) + next(c.info.nbytes for c in plan.components
                                                                  if c.info.name == "vae")
    assert whole - pinned_share(filed, live=True) == wasted
    # the resident blocks are read once at load, one at a time: the load holds one block's buffer more at most
    assert host_forecast(filed, live_replan=True).part("load read buffers") >= max(
        plan.blocks[i].read_nbytes for i in resident)


def test_two_experts_and_resident_mode_keep_their_plans(demo_model_dir: Path):
    plan = make_plan(discover_model(demo_model_dir), build_policy({}, 0, "resident"))
    assert masters_in_files(plan) is plan


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("phase", "at"), [("denoise", 2), ("vae_decode", 1)])
def test_a_run_load_holds_no_master_of_the_device_and_still_steps_down_bit_identically(demo_model_dir: Path,
                                                                                       phase: str, at: int, device):
    engine = Engine(demo_model_dir, device=device, options=EngineOptions(live_replan=True))
    try:
        filed = masters_in_files(engine.make_plan(POLICY))
        load = engine.load(POLICY, tiers=filed.tiers)
        streamer = engine.placement.streamer
        streamed = [b.nbytes for b in filed.blocks if b.streamed]
        resident = sum(b.nbytes for b in filed.blocks if not b.streamed)
        # the arena holds the streamed blocks alone (each region on its own pages on a CPU), no bounce ring stays
        tensors = len(streamer.streamed_bindings())  # a CPU arena keeps each tensor at its file's page phase
        if device == "cuda":  # what is page-locked is what the plan names (regions aligned), no more
            assert filed.forecast.pinned_host_bytes <= load.pinned_bytes <= load.host_master_bytes
        assert sum(streamed) <= streamer.host_bytes <= sum(streamed) + PAGE * tensors < sum(streamed) + resident
        assert streamer.bounce_bytes == 0
        vae = engine.placement.stagers["vae"]
        assert isinstance(vae, FileStager) and vae.held and vae.held_host_bytes < PAGE
        named = filed.forecast.pinned_host_bytes  # the streamed blocks and the staged encoders' masters
        staged = sum(s.staged_bytes for s in engine.placement.stagers.values() if s is not vae)
        slack = load.host_master_bytes - named
        assert 0 <= slack <= PAGE * tensors + staged // 10 < resident
        sub = engine.bus.subscribe()
        fault = OomAt(inside(engine, phase), at)
        result = engine.generate(REQUEST)
        fault.handle.remove()
        assert fault.raised == 1 and [e.phase for e in sub.drain() if isinstance(e, OomStepDown)] == [phase]
        expected = 0 if phase == "vae_decode" else 2
        assert engine.plan.residency.num_resident == expected and engine.plan.tiers == filed.tiers
        # the blocks streamed now are read from their files at each forward: the same bytes
        clean = clean_image(demo_model_dir, engine.plan.policy, device)
        assert same_image(np.asarray(result.image), clean, device)
        assert same_image(np.asarray(engine.generate(REQUEST).image), clean, device)
    finally:
        engine.close()
