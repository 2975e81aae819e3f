"""With a model loaded, the policy keys re-plan it live between requests (no reload)."""

from __future__ import annotations

import pytest
from app_helpers import load, make_app, until

from omni_console.engine.engine import Engine
from omni_console.engine.events import Replanned
from omni_console.engine.options import EngineOptions


@pytest.fixture
def live_engine(demo_model_dir):
    engine = Engine(demo_model_dir, device="cpu", options=EngineOptions(live_replan=True))
    yield engine
    engine.close()


@pytest.mark.slow
async def test_live_keys_replan_the_loaded_model_and_say_what_moved(live_engine, tmp_path):
    app = make_app(live_engine, tmp_path)
    try:
        async with app.run_test(size=(140, 50)) as pilot:
            await load(pilot, app)
            assert app.phase == "live"
            await pilot.press("plus", "plus")
            await until(pilot, lambda: live_engine.plan.policy.resident_layers == 2)
            # the header says what the engine runs now, not what it loaded with
            await until(pilot, lambda: "resident layers 2" in app.live_screen.status_text)
            assert "resident layers 0" not in app.live_screen.status_text
            await pilot.press("o")
            await until(pilot, lambda: live_engine.plan.residency.placement == "spread")
            await pilot.press("right_square_bracket")
            await until(pilot, lambda: live_engine.placement.streamer.num_slots == 3)
            assert app.phase == "live" and live_engine.state.value == "ready"  # never unloaded
            await until(pilot, lambda: any(n[0].startswith("re-plan:") for n in app.notices))
            await until(pilot, lambda: any("REPLAN" in line for line in app.live_screen.staging._lines))
            assert app.action_edit("mode") is False and "new load" in app.notices[-1][0]
    finally:
        app.shutdown()


@pytest.mark.slow
async def test_without_a_live_load_the_edit_is_refused_and_undone(engine, tmp_path):
    app = make_app(engine, tmp_path)
    try:
        async with app.run_test(size=(140, 50)) as pilot:
            await load(pilot, app)
            await pilot.press("plus")  # not offered: loaded without live re-plan
            assert app.policy.resident_layers == 0
            app.action_edit("layers", 1)  # even when forced through, the engine refuses and the edit is undone
            await until(pilot, lambda: any("re-plan refused" in n[0] for n in app.notices))
            assert app.policy.resident_layers == 0 == engine.plan.policy.resident_layers
    finally:
        app.shutdown()


def test_replanned_events_are_worded_for_the_log():
    from omni_console.console.event_text import format_event, progress_line

    event = Replanned(summary="re-plan: DiT 0→2 resident (leading), ring 2→2 · copied 1.0 MB, freed 0 bytes in 5 ms",
                      copied_bytes=10**6, freed_bytes=0, ring_bytes=0, seconds=0.005)
    assert "REPLAN DiT 0→2 resident" in format_event(event)
    assert progress_line(event)[0].startswith("re-plan:")


@pytest.mark.slow
async def test_the_console_forecasts_the_host_memory_a_live_load_keeps(live_engine, tmp_path):
    from omni_console.offload.units import format_bytes

    app = make_app(live_engine, tmp_path)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            await pilot.press("plus", "plus", "plus")  # resident blocks: run would not keep their masters
            f = app.plan.forecast
            assert app.plan_screen.forecast.rows["pinned host memory"] == format_bytes(f.pinned_host_bytes_live)
            assert f.pinned_host_bytes_live > f.pinned_host_bytes  # run would keep less
    finally:
        app.shutdown()
