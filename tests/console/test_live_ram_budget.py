"""The console under --ram-budget: its live re-plan masters are planned against the budget (the blocks that do not
fit stay in their files), the load carries the planned tiers out, the host panel shows them, and a re-plan that
makes such a block resident reads it from there and says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from app_helpers import make_app, screen_text, until

from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.engine.planning.ram_plan import fixed_host_bytes, host_items
from omni_console.engine.planning.request_profile import RequestSize
from omni_console.offload.policy import build_policy
from omni_console.offload.tiers import bounce_ring_bytes


@pytest.fixture
def live_engine(demo_model_dir: Path, tmp_path: Path, monkeypatch):
    """The demo model with 24 single blocks (more than the bounce ring's slots, so file tiers can pay), loaded
    with live re-plan masters as the console loads."""
    import torch
    from diffusers import FluxTransformer2DModel

    shutil.copytree(demo_model_dir, tmp_path / "demo-flux")
    config = FluxTransformer2DModel.load_config(tmp_path / "demo-flux" / "transformer")
    torch.manual_seed(0)
    FluxTransformer2DModel.from_config({**config, "num_single_layers": 24}).save_pretrained(
        tmp_path / "demo-flux" / "transformer")
    monkeypatch.chdir(tmp_path)
    engine = Engine(Path("demo-flux"), device="cpu", options=EngineOptions(live_replan=True))
    yield engine
    engine.close()


@pytest.mark.slow
async def test_live_masters_beyond_the_budget_stay_in_files_and_a_re_plan_reads_them(live_engine, tmp_path):
    policy = build_policy({}, 0)
    plan = live_engine.make_plan(policy)
    items, _ = host_items(plan, live=True)
    assert len(items) == len(plan.blocks)  # every block's master is a candidate
    largest = max(i.nbytes for i in items)
    fixed = fixed_host_bytes(plan, live=True, size=RequestSize(), on_cpu=True)
    budget = fixed + bounce_ring_bytes(largest) + 2 * largest  # room for two masters pinned, not all of them
    app = make_app(live_engine, tmp_path, policy, ram_budget=budget)
    try:
        async with app.run_test(size=(160, 60)) as pilot:
            await until(pilot, lambda: app.plan_screen.ram.has_class("-shown") and not app.ram_plans.pending,
                        limit=2000)
            app.plan_screen.ram.scroll_visible(animate=False)
            await pilot.pause()
            assert "from the page cache" in screen_text(app) or "from disk" in screen_text(app)
            await pilot.press("l")
            await until(pilot, lambda: app.phase == "live" and app.screen is app.live_screen, limit=3000)
            loaded = live_engine.plan.tiers
            assert any(t != "pinned" for t in loaded.blocks)  # the load carried out the planned tiers
            s = live_engine.placement.streamer
            assert s.keep_masters and s.filler.file_blocks
            assert s.filler.arena.nbytes < sum(b.nbytes for b in plan.blocks)  # not every master is held
            app.drain_events()
            app.live_screen.host.scroll_visible(animate=False)
            await pilot.pause()
            await until(pilot, lambda: "tiers    pinned" in screen_text(app), limit=500)
            assert "read     pinned" in screen_text(app)
            first = next(i for i, t in enumerate(loaded.blocks) if t != "pinned")
            for _ in range(first + 1):  # one more leading block resident each time, up to the first in a file
                await pilot.press("plus")

            def replans() -> list[str]:
                return [n for n, _ in app.notices if "re-plan:" in n]

            await until(pilot, lambda: len(replans()) == first + 1, limit=5000)
            assert all("read from the page cache or disk" not in n for n in replans()[:-1])  # masters pinned
            assert "1 blocks (" in replans()[-1] and "read from the page cache or disk" in replans()[-1]
            assert live_engine.plan.residency.num_resident == first + 1
            assert live_engine.plan.tiers == loaded
    finally:
        app.shutdown()
