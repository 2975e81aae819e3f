"""The plan screen's streaming keys: placement (p), ring depth ([ ]) and the VRAM budget (b)."""

from __future__ import annotations

import pytest
from app_helpers import screen_text, until

from omni_console.console.screens.budget import BudgetDialog
from omni_console.offload.units import format_bytes


@pytest.mark.slow
async def test_placement_and_ring_depth_keys_replan_and_show_in_the_forecast(app, engine):
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.pause()
        for _ in range(3):
            await pilot.press("plus")
        await pilot.press("o")
        assert app.policy.placement == "spread" and app.plan.residency.placement == "spread"
        assert app.plan.residency.resident != tuple(i < 3 for i in range(6))
        assert "spread" in app.notices[-1][0]
        await pilot.press("right_square_bracket")
        assert app.policy.prefetch_slots == 3 and app.plan.forecast.streaming_slots == 3
        streamed = [note for label, _, note in app.plan_screen.forecast._shown if label.startswith("streamed")]
        assert len(streamed) == 1 and "3 resident (spread), 3 slots" in streamed[0]
        assert "no vLLM-Omni spelling" in " ".join(app.plan_screen.policy_panel.flags.splitlines()) or \
            app.plan.residency.placement == "spread"
        for _ in range(5):
            await pilot.press("left_square_bracket")
        assert app.policy.prefetch_slots == 2 and "already at 2" in app.notices[-1][0]


@pytest.mark.slow
async def test_budget_key_asks_for_a_size_and_takes_the_planners_policy(app, engine):
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.pause()
        await pilot.press("b")
        await until(pilot, lambda: isinstance(app.screen, BudgetDialog))
        assert "last budget: none" in screen_text(app)  # no example posing as a value in the field
        assert app.screen.query_one("#budget-size").value == ""
        await pilot.press(*"lots", "enter")
        assert isinstance(app.screen, BudgetDialog)  # a typo is answered in the dialog
        assert "must be a size" in str(app.screen.query_one("#budget-error").render())
        field = app.screen.query_one("#budget-size")
        field.value = "auto"  # a CPU has no device memory to budget: said in the dialog
        await pilot.press("enter")
        assert isinstance(app.screen, BudgetDialog)
        assert "the budget auto: the device is cpu" in str(app.screen.query_one("#budget-error").render())
        field.value = f"{engine.model.nbytes * 2}B"
        await pilot.press("enter")
        await until(pilot, lambda: app.policy.resident_layers == 6)
        assert app.plan.forecast.num_streamed_blocks == 0  # twice the model fits: nothing streams
        assert not any(c.residency == "staged" for c in app.plan.components)
        assert app.notices[-1][0].startswith(f"VRAM budget {format_bytes(engine.model.nbytes * 2)}:")
        await pilot.press("b")  # the dialog starts from the budget entered, and says what auto would give
        await until(pilot, lambda: isinstance(app.screen, BudgetDialog))
        assert app.screen.query_one("#budget-size").value == f"{engine.model.nbytes * 2}B"
        shown = screen_text(app)
        assert f"last budget: {engine.model.nbytes * 2}B" in shown
        auto = str(app.screen.query_one("#budget-auto").render())
        assert auto == "auto now: none — the device is cpu, which has no device memory to budget"
        assert all(word in shown for word in auto.split())  # on screen (wrapped)
        await pilot.press("escape")


@pytest.mark.slow
async def test_a_budget_nothing_fits_is_one_error_and_the_policy_stays(app, engine):
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.pause()
        before = app.policy
        await pilot.press("b")
        await until(pilot, lambda: isinstance(app.screen, BudgetDialog))
        await pilot.press(*"1000B", "enter")
        await until(pilot, lambda: any("nothing fits" in n[0] for n in app.notices))
        assert app.policy == before
