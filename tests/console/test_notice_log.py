"""`n` lists every notice of the session with its time, though toasts were coalesced or timed out."""

from __future__ import annotations

import re

from app_helpers import screen_text, until

from omni_console.console.screens import NoticeLogScreen, PlanScreen


async def test_n_lists_every_notice_with_its_time_after_the_toasts_are_gone(app):
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app.say("first notice")
        for _ in range(3):
            app.say("repeated notice")  # one toast for the three: the log keeps all three
        app.say("a failure", "error")
        await pilot.pause()
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NoticeLogScreen))
        shown = screen_text(app)
        rows = re.findall(r"(\d\d:\d\d:\d\d) (information|error)\s+(first notice|repeated notice|a failure)", shown)
        assert [r[2] for r in rows] == ["first notice", *["repeated notice"] * 3, "a failure"]
        assert rows[-1][1] == "error"
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, PlanScreen))
