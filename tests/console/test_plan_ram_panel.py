"""The plan screen under `--ram-budget`: a panel with the host budget, the pin cap, the streamed blocks per host
tier and the predicted host peak (the figures `plan --ram-budget` gives for the console's load), the planner's
lines under it; a budget nothing fits says so with the smallest host peak; no panel without a budget.
Snapshots at 80x24 and 160x48 (regenerate with --snapshot-update, look at the SVGs)."""

from __future__ import annotations

import pytest
from app_helpers import make_app, screen_text, until
from test_snapshots import settle_plan, stable_engine  # noqa: F401  (a fixture)

from omni_console.engine.plan_flow import plan_for
from omni_console.engine.planning import ram_flow
from omni_console.engine.planning.tier_rates import CachedRates
from omni_console.offload.units import format_bytes

GB = 10**9


def panel_shown(app) -> bool:
    return app.plan_screen.ram.has_class("-shown") and "planning" not in str(app.plan_screen.ram.render())


async def settle_ram(pilot) -> None:
    await settle_plan(pilot)
    app = pilot.app
    await until(pilot, lambda: panel_shown(app) and not app.ram_plans.pending, limit=2000)
    app.plan_screen.ram.scroll_visible(animate=False)
    await pilot.pause()


@pytest.mark.slow
async def test_the_plan_screen_shows_the_ram_budgets_decisions(stable_engine, tmp_path):  # noqa: F811
    app = make_app(stable_engine, tmp_path, ram_budget=8 * GB)
    try:
        async with app.run_test(size=(160, 60)) as pilot:
            await settle_ram(pilot)
            text = screen_text(app)
            expected = plan_for(stable_engine, app.plan, None, app.session.request_size, forecast=False,
                                ram_budget=8 * GB, live=stable_engine.live_replan).ram
            assert expected is not None
            assert "host tiers (--ram-budget)" in text
            assert f"host budget {format_bytes(8 * GB)}".replace(" ", "") in text.replace(" ", "")
            assert f"pin cap {format_bytes(expected.choice.pin_cap)}".replace(" ", "") in text.replace(" ", "")
            peak = f"{format_bytes(expected.choice.cost.host_peak_bytes)} of {format_bytes(8 * GB)}"
            assert peak in text
            streamed = sum(b.streamed for b in app.plan.blocks)
            assert f"{streamed} pinned" in text  # the console's live masters: every block pinned
            assert expected.reasons[0][:40] in text  # the planner's own lines, as `plan` prints them
            await pilot.press("plus")  # another policy: planned again
            await until(pilot, lambda: app.plan.residency.num_resident == 1)
            await until(pilot, lambda: panel_shown(app) and not app.ram_plans.pending, limit=2000)
            assert f"{streamed - 1} pinned" in screen_text(app)
    finally:
        app.shutdown()


@pytest.mark.slow
async def test_a_budget_nothing_fits_is_said_on_the_plan_screen(stable_engine, tmp_path):  # noqa: F811
    app = make_app(stable_engine, tmp_path, ram_budget=10**6)
    try:
        async with app.run_test(size=(160, 60)) as pilot:
            await settle_ram(pilot)
            assert app.plan_screen.ram.has_class("-refused")
            text = screen_text(app)
            assert "this policy does not fit:" in text and "smallest" in text
    finally:
        app.shutdown()


@pytest.mark.slow
async def test_no_panel_without_a_ram_budget(stable_engine, tmp_path):  # noqa: F811
    app = make_app(stable_engine, tmp_path)
    try:
        async with app.run_test(size=(160, 60)) as pilot:
            await settle_plan(pilot)
            assert not app.plan_screen.ram.has_class("-shown") and "--ram-budget" not in screen_text(app)
    finally:
        app.shutdown()


FIXED_RATES = CachedRates(device="cpu", filesystem="fixed", page_cache_bytes_per_s=8e9, disk_bytes_per_s=2e9,
                          o_direct=True, note="read 2 MiB of a fixed file", measured_at="2026-12-05T00:00:00")


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_plan_ram_panel_snapshot(snap_compare, stable_engine, tmp_path, size, monkeypatch):  # noqa: F811
    # this machine's disk rates and the day they were probed would show: fixed ones, as the telemetry is fixed
    monkeypatch.setattr(ram_flow, "measured_rates", lambda *args, **kwargs: FIXED_RATES)
    app = make_app(stable_engine, tmp_path, theme="omni-dark", ram_budget=8 * GB)
    try:
        assert snap_compare(app, terminal_size=size, run_before=settle_ram)
    finally:
        app.shutdown()
