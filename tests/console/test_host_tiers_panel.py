"""The live screen's host panel under host tiers: bytes per tier (planned and read since the load) and the page
cache's and disk's read rates, from the plan's tiers and the staging events' `tier`; nothing of tiers when every
byte is pinned. Snapshots at 80x24 and 160x48 (regenerate with --snapshot-update, look at the SVGs)."""

from __future__ import annotations

import dataclasses
import time

import pytest
from app_helpers import screen_text, until
from test_snapshots import settle_live, stable_app, stable_engine  # noqa: F401  (a fixture)

from omni_console.console.tier_traffic import TierTraffic, planned_tier_bytes, tier_lines
from omni_console.offload.events import StagingEvent
from omni_console.offload.policy import build_policy
from omni_console.offload.tiers import HostTiers

MB = 10**6


def block(t: float, nbytes: int, tier: str, n: int = 0) -> StagingEvent:
    return StagingEvent(t=t, target=f"transformer.single_transformer_blocks.{n}", direction="h2d", nbytes=nbytes,
                        seconds=0.001, tier=tier)


# a request's staging: 1 s of events, 40 MB from the page cache, 60 MB from disk, 30 MB pinned, one d2h ignored
KNOWN = [block(200.0, 10 * MB, "pinned"), block(200.0, 20 * MB, "page_cache", 1), block(200.25, 30 * MB, "disk", 2),
         block(200.5, 20 * MB, "pinned"), block(200.75, 20 * MB, "page_cache", 1), block(201.0, 30 * MB, "disk", 2),
         StagingEvent(t=201.0, target="text_encoder", direction="d2h", nbytes=5 * MB, seconds=0.001)]


def test_traffic_counts_bytes_per_tier_and_rates_over_the_events_window():
    traffic = TierTraffic()
    assert not traffic.add([KNOWN[-1]]) and not traffic.uses_files
    assert traffic.add(KNOWN)
    assert traffic.read == {"pinned": 30 * MB, "page_cache": 40 * MB, "disk": 60 * MB}
    assert traffic.rate("disk") == pytest.approx(60 * MB / 1.0) and traffic.rate("page_cache") == pytest.approx(40 * MB)
    assert traffic.uses_files
    # three seconds later, 2 s of disk reads: the window holds only the last two seconds' events
    traffic.add([block(202.0, 50 * MB, "disk"), block(203.0, 50 * MB, "disk"), block(204.0, 50 * MB, "disk")])
    assert traffic.rate("disk") == pytest.approx(150 * MB / 2.0) and traffic.rate("page_cache") is None
    lines = tier_lines(traffic)
    assert lines[1] == "read     pinned 30.0 MB · page cache 40.0 MB · disk 210.0 MB"
    assert lines[2].startswith("rate     disk 75.0 MB/s") and "(last 2 s)" in lines[2]


def test_planned_bytes_follow_the_plans_tiers(stable_engine):  # noqa: F811
    plan = stable_engine.make_plan(build_policy({}, 1))
    every = sum(b.nbytes for b in plan.blocks if b.streamed)
    staged = sum(c.host_bytes for c in plan.components if c.residency == "staged")
    assert planned_tier_bytes(plan) == {"pinned": every + staged, "page_cache": 0, "disk": 0}
    tiers = tuple("disk" if i % 2 else "page_cache" for i in range(len(plan.blocks)))
    held = planned_tier_bytes(dataclasses.replace(plan, tiers=HostTiers(blocks=tiers)))
    assert held["pinned"] == staged and held["page_cache"] + held["disk"] == every
    assert held["disk"] == sum(b.nbytes for i, b in enumerate(plan.blocks) if b.streamed and i % 2)


async def feed_known(pilot) -> None:
    """Load, then publish the known staging events on the engine's bus, as the streamer would (the load's own
    staging, timed by the clock, is forgotten first, as `settle_live` clears the staging log)."""
    await settle_live(pilot)
    app = pilot.app
    app.live_screen.tiers = TierTraffic()
    app.live_screen.show_plan(app.plan)
    for event in KNOWN:
        app.engine.bus.publish(event)
    app.drain_events()
    await pilot.pause()
    app.live_screen.host.scroll_visible(animate=False)
    await pilot.pause()


@pytest.mark.slow
async def test_pilot_reads_the_per_tier_figures_back_from_the_host_panel(stable_engine, tmp_path):  # noqa: F811
    app = stable_app(stable_engine, tmp_path, "omni-dark")
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await settle_live(pilot)
            assert "page cache" not in screen_text(app)  # every byte pinned: no tier lines
            loaded = app.live_screen.tiers.read["pinned"]  # the load's own staging (encoders, the fixed events)
            later = time.monotonic() + 10 - KNOWN[0].t  # after the load's events: the rate's window holds ours alone
            for event in KNOWN:
                app.engine.bus.publish(dataclasses.replace(event, t=event.t + later))
            app.drain_events()
            await until(pilot, lambda: "read     pinned" in screen_text(app))
            text = screen_text(app)
            assert f"read     pinned {(loaded + 30 * MB) / MB:.1f} MB · page cache 40.0 MB · disk 60.0 MB" in text
            assert "rate     page cache 40.0 MB/s · disk 60.0 MB/s (last 2 s)" in text
            planned = app.live_screen.tiers.held["pinned"]
            assert f"tiers    pinned {planned / MB:.1f} MB · page cache 0 bytes · disk 0 bytes" in text
    finally:
        app.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_host_panel_tiers_snapshot(snap_compare, stable_engine, tmp_path, size):  # noqa: F811
    app = stable_app(stable_engine, tmp_path, "omni-dark")
    try:
        assert snap_compare(app, terminal_size=size, run_before=feed_known)
    finally:
        app.shutdown()
