"""At 80x24 (a default terminal) the numbers that matter are on screen without scrolling, the footer
is whole and lists only keys that work, and every panel is reachable with tab and scrollable with PgDn."""

from __future__ import annotations

import pytest
from app_helpers import forecast_shown, load, screen_text, until
from textual.geometry import Region
from textual.widget import Widget
from textual.widgets import Footer
from textual.widgets._toast import Toast

from omni_console.console.screens import LiveScreen, PlanScreen
from omni_console.console.widgets.plan_blocks import LEGEND, BlockListPanel
from omni_console.console.widgets.plan_forecast import ForecastPanel
from omni_console.engine.events import LoadProgress, StepTiming

SIZE = (80, 24)


def assert_fully_shown(widget: Widget) -> None:
    """The widget is drawn, whole, inside the terminal (no scrolling needed to read it)."""
    screen = widget.screen
    assert widget.display and widget.visible
    region = widget.region
    assert region.area > 0, f"{widget!r} is not drawn"
    assert Region(0, 0, *screen.size).contains_region(region), f"{widget!r} at {region} is off the {screen.size} screen"
    # and no scroll container around it cuts it off
    for ancestor in widget.ancestors_with_self:
        if isinstance(ancestor, Widget) and ancestor is not widget and ancestor is not screen:
            assert ancestor.region.contains_region(region), f"{widget!r} is clipped by {ancestor!r}"


def footer_text(app) -> str:
    return screen_text(app).splitlines()[-1]


async def test_plan_screen_forecast_and_footer_fit_80x24(app):
    async with app.run_test(size=SIZE) as pilot:
        await forecast_shown(pilot, app)
        plan = app.screen
        assert isinstance(plan, PlanScreen)
        forecast = plan.query_one(ForecastPanel)
        assert_fully_shown(forecast)
        text = screen_text(app)
        for label, value in forecast.rows.items():
            shown = "host memory (not pinned: CPU)" if label == "pinned host memory" else label
            line = next(ln for ln in text.splitlines() if shown in ln)
            assert value in line, (label, value, line)
        footer = plan.query_one(Footer)
        assert_fully_shown(footer)
        await until(pilot, lambda: "? help" in footer_text(app))  # the footer's first frame may come a tick later
        last = footer_text(app)
        for words in ("⏎ toggle", "l load", "+ - layers", "m mode", "? help"):
            assert words in last, last
        assert last.rstrip().endswith("? help")  # the last key is whole, not cut at column 80


async def test_plan_screen_shows_the_block_lists_and_what_6_2_plus_4_means(app):
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        blocks = app.screen.query_one(BlockListPanel)
        assert_fully_shown(blocks)
        attrs = {row[1]: row[2] for row in blocks.rows if row[0] == "transformer"}
        assert attrs == {"transformer_blocks": "2", "single_transformer_blocks": "4",
                         "(non-block modules: resident)": ""}
        text = screen_text(app)
        assert "6 (2+4)" in text and LEGEND in text
        assert "single_transformer_blocks" in text


@pytest.mark.slow
async def test_live_screen_key_numbers_and_footer_fit_80x24(app, engine):
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await load(pilot, app)
        live = app.live_screen
        assert isinstance(live, LiveScreen)
        app.sampler.sample_now(publish=True)
        app.drain_events()
        engine.bus.publish(StepTiming(request_id=1, step=2, total_steps=2, wall_s=0.25, stall_s=0.05))
        app.drain_events()
        await until(pilot, lambda: "step 250.0 ms (stall 50.0 ms)" in live.key_numbers.text)
        await until(pilot, lambda: "allocated 3.0 GB" in live.key_numbers.text)  # the sample's redraw may lag
        # the step figure on one screen line, never wrapped inside (the layout may take a frame to settle)
        await until(pilot, lambda: any("step 250.0 ms (stall 50.0 ms)" in ln for ln in screen_text(app).splitlines()))
        assert_fully_shown(live.key_numbers)
        text = screen_text(app)
        lines = text.splitlines()
        at = next(i for i, ln in enumerate(lines) if "allocated" in ln)
        line = " ".join(lines[at:at + 2])  # at 80 columns the step figure goes whole onto the next line
        # the injected sources: 3 GB allocated, 5 GB reserved, free for us = 137.7 + 2 GB cached
        for words in ("allocated 3.0 GB", "reserved 5.0 GB", "free 139.7 GB", "step 250.0 ms"):
            assert words in line, line
        assert_fully_shown(live.query_one(Footer))
        await until(pilot, lambda: "g generate" in footer_text(app))
        last = footer_text(app)
        for words in ("g generate", "u unload", "/ filter", "p pause log", "? help"):
            assert words in last, last
        for dead in ("toggle", "default", "layers"):  # policy keys do nothing once loaded: not offered
            assert dead not in last, last


@pytest.mark.slow
async def test_tab_reaches_every_live_panel_and_pgdn_scrolls_the_screen_80x24(app):
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await load(pilot, app)
        await pilot.pause()
        live = app.live_screen
        panels = {live.allocator, live.host, live.policy_panel, live.residency, live.steps, live.staging}
        reached: set[Widget] = set()
        for _ in range(12):
            await pilot.press("tab")
            await pilot.pause()
            focused = app.focused
            assert focused is not None
            panel = next((w for w in focused.ancestors_with_self if w in panels), None)
            assert panel is not None, f"tab focused {focused!r}, outside every panel"
            reached.add(panel)
            # a focused panel is scrolled into view: its top line is on screen
            assert panel.region.y < SIZE[1] - 1 and panel.region.bottom > 0, panel
        assert reached == panels
        columns = live.query_one("#live-columns")
        live.host.focus()
        await pilot.pause()
        before = columns.scroll_y
        await pilot.press("pagedown")
        await pilot.pause()
        assert columns.scroll_y > before  # the host panel cannot scroll: PgDn scrolls the screen around it
        await pilot.press("pageup")
        await pilot.pause()
        assert columns.scroll_y < before + 1 or columns.scroll_y == 0


@pytest.mark.slow
async def test_tab_reaches_every_plan_panel(app):
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        plan = app.screen
        wanted = {plan.table, plan.forecast, plan.blocks, plan.policy_panel}
        reached = set()
        for _ in range(6):
            reached.add(app.focused)
            await pilot.press("tab")
            await pilot.pause()
        assert wanted <= reached
        plan.policy_panel.focus()
        await until(pilot, lambda: 0 < plan.policy_panel.region.y < SIZE[1] - 1)  # scrolled (animated) into view
        region = plan.policy_panel.region
        assert 0 < region.y < SIZE[1] - 1 and region.height > 0  # scrolled into view
        body = plan.query_one("#plan-body")
        assert body.scroll_y > 0  # focusing the policy panel scrolled the body to it


@pytest.mark.slow
async def test_text_beside_a_progress_bar_is_never_cut_short(app):
    """The request line and the load rows take the width; the bar beside them is short, not the text."""
    saved = "request 7: 'a red cube' · saved /home/operator/renders/omni-console-out/request-0007-20260101-120000.png"
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        plan = app.screen
        plan.load_started()
        plan.load_events([LoadProgress(component="text_encoder", done_bytes=0, total_bytes=172_000, phase="host"),
                          LoadProgress(component="transformer", done_bytes=1_000_000, total_bytes=2_500_000,
                                       phase="place")], [])
        await pilot.pause()
        text = screen_text(app)
        assert "text_encoder · read from disk · 0 bytes / 172.0 kB" in text
        assert "transformer · placed · 1.0 MB / 2.5 MB" in text
        assert "…" not in "".join(ln for ln in text.splitlines() if "read from disk" in ln or "placed" in ln)
        plan.load_ended(None)
        await load(pilot, app)
        app.live_screen.set_generation(saved, 3, 3)
        await pilot.pause()
        line = next(ln for ln in screen_text(app).splitlines() if "request 7" in ln)
        assert saved in line and "100%" in line  # the whole path on one line, the bar after it


@pytest.mark.slow
async def test_a_saved_path_is_never_folded_inside_a_word_at_80_columns(app):
    """The request line wraps at spaces only: a path too long for the line loses its middle to `…`,
    keeping its start and the file name whole (before, `…-2026010` / `1-120000.png` were two lines)."""
    saved = "request 7: 'a red cube' · saved /home/operator/renders/omni-console-out/request-0007-20260101-120000.png"
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await load(pilot, app)
        app.live_screen.set_generation(saved, 3, 3)
        await pilot.pause()
        label = app.live_screen.gen_label
        rows = screen_text(app).splitlines()[label.region.y:label.region.bottom]
        words = " ".join(row[label.region.x:label.region.right] for row in rows).split()
        *before, path = words
        assert before == saved.split()[:-1]  # every other word whole, in order
        assert path.startswith("/home/operator/") and path.endswith("…/request-0007-20260101-120000.png"), words
        assert label.full_text == saved


@pytest.mark.slow
async def test_notices_cover_neither_the_forecast_nor_the_key_numbers_at_80x24(app):
    """At 80x24 a notice is one line over the title bar (one at a time), long words cut in the middle."""
    notice = "saved /home/operator/renders/omni-console-out/request-0007-20260101-120000.png"
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause()
        app.say("resident DiT layers (leading): 1 of 6", timeout=60)
        app.say(notice, timeout=60)
        await until(pilot, lambda: [t.region.height for t in app.screen.query(Toast)] == [1])
        (toast,) = app.screen.query(Toast)
        assert toast.region.y == 0
        assert not toast.region.overlaps(app.screen.query_one(ForecastPanel).region)
        line = screen_text(app).splitlines()[0]
        assert "saved /home/operator/" in line and line.rstrip().endswith("…/request-0007-20260101-120000.png")
        assert app.notices[-1] == (notice, "information")  # the history keeps the whole notice
        await load(pilot, app)
        app.say(notice, timeout=60)
        await until(pilot, lambda: len(app.screen.query(Toast)) == 1 and app.screen.query_one(Toast).region.y == 0)
        (toast,) = app.screen.query(Toast)
        for covered in (app.live_screen.key_numbers, app.live_screen.gen_label, app.live_screen.allocator):
            assert not toast.region.overlaps(covered.region), covered


async def test_notices_stay_in_the_corner_on_a_wide_terminal(app):
    async with app.run_test(size=(160, 48), notifications=True) as pilot:
        await pilot.pause()
        app.say("resident DiT layers (leading): 1 of 6", timeout=60)
        app.say("mode=resident: no offload (baseline); m switches back", timeout=60)
        await until(pilot, lambda: len(app.screen.query(Toast)) == 2)
        assert all(t.region.y > 24 and t.region.x >= 80 for t in app.screen.query(Toast))


def test_forecast_note_counts_the_streamers_slots(engine):
    """One streamed block is one slot on the device (what the streamer uses), more are two."""
    from omni_console.console.widgets.plan_forecast import LinkInfo, forecast_rows
    from omni_console.offload.policy import build_policy

    def peak_note(resident_layers: int) -> str:
        plan = engine.make_plan(build_policy({}, resident_layers))
        return next(note for label, _, note in forecast_rows(plan, LinkInfo(False)) if label == "device peak weights")

    assert "resident + 1 slot × largest streamed block" in peak_note(5)  # 6 blocks, 5 resident
    assert "resident + 2 slots × largest streamed block" in peak_note(0)


@pytest.mark.slow
async def test_p_shows_at_once_at_80x24_though_the_log_is_below_the_fold(app):
    """At 80x24 the staging log is under the memory panels: pausing it changed nothing on screen until the next
    paced redraw (key->frame p95 479 ms on the H200). The status line at the top says it now."""
    from omni_console.console.screens.live import LOG_PAUSED

    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await load(pilot, app)
        live = app.live_screen
        # the log is not on screen: below the visible rows of the single column
        assert not live.staging.region.overlaps(app.screen.region), live.staging.region
        assert LOG_PAUSED not in screen_text(app)
        await pilot.press("p")
        await pilot.pause()
        assert live.staging.paused and LOG_PAUSED in "".join(screen_text(app).splitlines()[1:4])
        await pilot.press("p")
        await pilot.pause()
        assert not live.staging.paused and LOG_PAUSED not in screen_text(app)


@pytest.mark.slow
async def test_p_pressed_again_and_again_at_80x24_keeps_its_notice_on_the_top_line(app):
    """With notices on, as on a real terminal: each p replaces the last notice. Textual left the replaced
    toast's empty holder behind, so each new notice sat one line lower (over the status line that says the
    log is paused, then over the panels). Each press shows its notice on the top line and its state below."""
    from omni_console.console.screens.live import LOG_PAUSED

    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause()
        await load(pilot, app)
        live = app.live_screen
        for press in range(4):
            await pilot.press("p")
            notice = LOG_PAUSED if live.staging.paused else "staging log live"
            await until(pilot, lambda n=notice: n in screen_text(app).splitlines()[0], limit=2000)
            (toast,) = app.screen.query(Toast)
            assert toast.region.y == 0, press
            status = "".join(screen_text(app).splitlines()[1:4])
            assert (LOG_PAUSED in status) == live.staging.paused, (press, status)
            assert not toast.region.overlaps(live.status_line.region)
