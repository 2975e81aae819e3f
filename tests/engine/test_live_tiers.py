"""A live re-plan load (the console's) whose block masters a --ram-budget left in the page cache or on disk: the
blocks in a file tier are read from their files when they stream and when a re-plan makes them resident, the
re-plan says how many it read, and every request draws what plain diffusers draws."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from test_tier_reads import REQUEST, engine_output, plain_output

from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.offload.policy import build_policy
from omni_console.offload.tiers import HostTiers


@pytest.mark.slow
def test_live_masters_in_file_tiers_are_read_by_re_plans_bit_identical(demo_model_dir: Path):
    expected = plain_output(demo_model_dir, REQUEST)
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=True))
    try:
        blocks = len(engine.make_plan(build_policy({}, 0)).blocks)
        tiers = HostTiers(blocks=tuple(("pinned", "disk", "page_cache")[i % 3] for i in range(blocks)))
        engine.load(build_policy({}, 1), tiers=tiers)
        s = engine.placement.streamer
        assert s.keep_masters and set(s.filler.file_blocks.values()) == {"disk", "page_cache"}
        in_files = sum(1 for t in tiers.blocks if t != "pinned")
        pinned_arena = s.filler.arena.nbytes
        assert 0 < pinned_arena < sum(b.nbytes for b in engine.plan.blocks)  # the file-tier masters are not held
        outputs = [engine_output(engine.generate(REQUEST, threading.Event()))]
        more = engine.replan(build_policy({}, blocks - 1))  # every file-tier block but the last made resident
        assert f"{in_files - (tiers.blocks[-1] != 'pinned')} blocks (" in more.summary
        assert "read from the page cache or disk, forecast ~" in more.summary  # at the tiers' cached rates
        assert engine.plan.tiers == tiers  # the masters stay where the load put them
        outputs.append(engine_output(engine.generate(REQUEST, threading.Event())))
        fewer = engine.replan(build_policy({}, 0, placement="spread"))
        assert "read from the page cache" not in fewer.summary  # nothing made resident: nothing read
        outputs.append(engine_output(engine.generate(REQUEST, threading.Event())))
        assert s.filler.arena.nbytes == pinned_arena
    finally:
        engine.close()
    for got in outputs:
        assert np.array_equal(got.reshape(expected.shape), expected)


def test_the_re_plans_read_forecast_is_the_newly_resident_file_blocks_at_their_tiers_rates(demo_model_dir, monkeypatch):
    import dataclasses

    import torch

    from omni_console.engine.loading import replan
    from omni_console.engine.model_dir.discovery import discover_model
    from omni_console.engine.planning import tier_rates
    from omni_console.engine.planning.plan import make_plan

    fixed = tier_rates.CachedRates(device="cpu", filesystem="fixed", page_cache_bytes_per_s=4e9, disk_bytes_per_s=1e9,
                                   o_direct=True, note="fixed", measured_at="2026-12-05T00:00:00")
    monkeypatch.setattr(tier_rates, "measured_rates", lambda *args, **kwargs: fixed)
    model = discover_model(demo_model_dir)
    old, new = make_plan(model, build_policy({}, 0)), make_plan(model, build_policy({}, 3))
    tiers = HostTiers(blocks=("disk", "pinned", "page_cache") + ("pinned",) * (len(old.blocks) - 3))
    old, new = dataclasses.replace(old, tiers=tiers), dataclasses.replace(new, tiers=tiers)
    cpu = torch.device("cpu")
    assert replan.file_read_forecast(old, new, cpu) == pytest.approx(new.blocks[0].nbytes / 1e9
                                                                      + new.blocks[2].nbytes / 4e9)
    assert replan.file_read_forecast(new, old, cpu) is None  # nothing made resident: nothing read
