"""The console's screens say what is true: the staging log follows the newest event, sparklines draw
equal values as equal bars, CPU runs are not described as GPU transfers, toasts do not pile up, and a
cancelled request says "cancelling…" until it ends."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import pytest
from app_helpers import finish, hold_first_step, load, screen_text, until
from textual.app import App, ComposeResult
from textual.binding import Binding

from omni_console.console.headless import default_request
from omni_console.console.screens.live import CANCELLING
from omni_console.console.toasts import toasts_replaced_by
from omni_console.console.widgets import StagingLog, StepTimings, format_event
from omni_console.console.widgets.zero_sparkline import BARS, ZeroSparkline, zero_based_bars
from omni_console.engine.events import StepTiming
from omni_console.offload.events import StagingEvent
from omni_console.themes import CSS_PATH, DEFAULT_THEME, register_themes


class Host(App):
    """The widget under test with the real stylesheet; `p` pauses the staging log."""

    CSS_PATH = CSS_PATH
    BINDINGS = [Binding("p", "pause", "pause")]

    def __init__(self, widget) -> None:
        super().__init__()
        self.widget = widget

    def compose(self) -> ComposeResult:
        yield self.widget

    def on_mount(self) -> None:
        register_themes(self, activate=DEFAULT_THEME)

    def action_pause(self) -> None:
        self.query_one(StagingLog).toggle_pause()


def transfers(first: int, count: int) -> list[StagingEvent]:
    return [StagingEvent(t=100.0 + i, target=f"block.{i}", direction="h2d", nbytes=10**6, seconds=0.001)
            for i in range(first, first + count)]


def shown_blocks(app: App) -> list[str]:
    return re.findall(r"H2D (block\.\d+) ", screen_text(app))


def newest_shown(app: App, index: int) -> bool:
    return f"H2D block.{index} " in screen_text(app)


# --------------------------------------------------------------------------- staging log follows


@pytest.mark.slow
async def test_staging_log_follows_the_newest_event_until_scrolled_up_then_end_follows_again():
    log = StagingLog()
    app = Host(log)
    async with app.run_test(size=(100, 16)) as pilot:
        await pilot.pause()
        # several batches between two refreshes (the drain timer under load): each must be followed
        for first in range(0, 200, 20):
            log.add_events(transfers(first, 20))
        await pilot.pause()
        assert newest_shown(app, 199) and not newest_shown(app, 100)
        assert "staging events — live" in screen_text(app)

        log.query_one("FollowLog").focus()
        await pilot.press("pageup")
        await pilot.pause()
        assert "staging events — scrolled up — End follows again" in screen_text(app)
        assert not newest_shown(app, 199)
        view = shown_blocks(app)
        log.add_events(transfers(200, 30))
        await pilot.pause()
        assert shown_blocks(app) == view  # new events do not move the view
        assert not newest_shown(app, 229)

        await pilot.press("end")
        await pilot.pause()
        assert newest_shown(app, 229) and "staging events — live" in screen_text(app)
        log.add_events(transfers(230, 5))
        await pilot.pause()
        assert newest_shown(app, 234)


async def test_paused_log_says_how_to_resume_and_follows_again_on_resume():
    log = StagingLog()
    app = Host(log)
    async with app.run_test(size=(100, 16)) as pilot:
        log.add_events(transfers(0, 50))
        await pilot.pause()
        await pilot.press("p")
        await pilot.pause()
        assert "staging events — paused (p resumes)" in screen_text(app)
        log.add_events(transfers(50, 40))
        await pilot.pause()
        assert newest_shown(app, 49) and not newest_shown(app, 89)
        assert "paused (40 buffered) · p resumes" in screen_text(app)
        await pilot.press("p")
        await pilot.pause()
        assert newest_shown(app, 89) and "staging events — live" in screen_text(app)


# --------------------------------------------------------------------------- sparklines from zero


def test_equal_values_draw_equal_bars_scaled_from_zero():
    bars = [bar for bar, _ in zero_based_bars([0.011, 0.011], 2)]
    assert bars == ["█", "█"]
    bars = [bar for bar, _ in zero_based_bars([0.011, 0.0111], 2)]
    assert bars[0] == bars[1] == "█"  # 1 % apart: the same bar, not the lowest and the highest
    bars = [bar for bar, _ in zero_based_bars([0.0, 0.5, 1.0], 3)]
    assert bars == [BARS[0], BARS[4], BARS[-1]]  # height proportional to the value
    assert [bar for bar, _ in zero_based_bars([0.0, 0.0], 2)] == [BARS[0]] * 2


async def test_step_timings_sparklines_draw_equal_stalls_as_equal_bars():
    timings = StepTimings()
    app = Host(timings)
    async with app.run_test(size=(100, 20)) as pilot:
        timings.add_steps([StepTiming(request_id=1, step=i, total_steps=2, wall_s=0.5, stall_s=0.011)
                           for i in (1, 2)])
        await pilot.pause()
        spark = timings.query_one("#stall-spark", ZeroSparkline)
        drawn = {ch for ch in screen_text(app).splitlines()[spark.region.y][spark.region.x:spark.region.right]}
        assert drawn == {"█"}, drawn


# --------------------------------------------------------------------------- CPU wording


def test_offload_is_a_re_point_not_a_zero_byte_copy():
    line = format_event(StagingEvent(t=1.0, target="vae", direction="d2h", nbytes=0, seconds=0.0022), 0.0)
    assert "offload vae (re-pointed to host master, no copy) 2.2 ms" in line
    assert "GB/s" not in line and "D2H" not in line


def test_cpu_transfers_are_host_copies_without_a_rate():
    event = StagingEvent(t=1.0, target="block.0", direction="h2d", nbytes=10**9, seconds=0.1)
    assert "10.0 GB/s" in format_event(event, 0.0)  # a GPU link: the rate is the link's
    line = format_event(event, 0.0, on_cpu=True)
    assert "host copy (CPU: no device link)" in line and "GB/s" not in line


async def test_step_timings_on_cpu_say_host_copies():
    timings = StepTimings(on_cpu=True)
    app = Host(timings)
    async with app.run_test(size=(160, 20)) as pilot:
        timings.add_steps([StepTiming(request_id=1, step=1, total_steps=1, wall_s=0.5, stall_s=0.0,
                                      h2d_bytes=10**9)])
        await pilot.pause()
        text = screen_text(app)
        assert "host copies 1.0 GB/step (CPU: no device link)" in text
        assert "H2D" not in text and not re.search(r"GB/s\b", text), text


# --------------------------------------------------------------------------- toasts


@dataclass
class FakeToast:
    message: str
    raised_at: float
    severity: str = "information"
    title: str = ""
    timeout: float = 5.0


def test_a_repeated_notice_replaces_its_toast_and_at_most_two_show():
    shown = [FakeToast("resident layers 3", 100.0)]
    assert toasts_replaced_by(FakeToast("resident layers 3", 101.0), shown) == shown
    assert toasts_replaced_by(FakeToast("resident layers 3", 110.0), shown) == []  # expired by then
    error, old, newer = FakeToast("boom", 100.0, "error"), FakeToast("a", 100.5), FakeToast("b", 101.0)
    replaced = toasts_replaced_by(FakeToast("c", 102.0), [error, old, newer])
    assert replaced == [old, newer]  # the error stays: with the new one, two show


@pytest.mark.slow
async def test_seven_presses_of_minus_leave_at_most_two_toasts(app):
    async with app.run_test(size=(160, 48), notifications=True) as pilot:
        await pilot.pause()
        await pilot.press(*["minus"] * 7)
        await pilot.pause()
        await pilot.pause()
        assert len(app.notices) == 7  # every notice is still kept in the history
        assert len(app.screen.query("Toast")) == 1  # seven equal notices: one toast
        await pilot.press("plus", "plus", "minus")  # different texts: still at most two
        await pilot.pause()
        await pilot.pause()
        assert len(app.screen.query("Toast")) <= 2


# --------------------------------------------------------------------------- cancelling


@pytest.mark.slow
async def test_escape_on_a_slow_step_says_cancelling_until_the_request_ends(app, monkeypatch):
    in_first_step, finish_step = hold_first_step(monkeypatch)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        future = app.start_generate(default_request(app.engine, prompt="a red cube", steps=4))
        assert await asyncio.to_thread(in_first_step.wait, 30)
        await pilot.press("escape")
        for _ in range(3):  # toasts expire; the status line keeps saying it while the step runs
            await pilot.pause()
            assert CANCELLING in screen_text(app)
            await asyncio.sleep(0.05)
        app.drain_events()
        await pilot.pause()
        assert CANCELLING in screen_text(app)  # events during the step do not overwrite it
        finish_step.set()
        await finish(pilot, future, lambda: not app.generating)
        await until(pilot, lambda: CANCELLING not in screen_text(app))
        assert "cancelled after 1/4 steps" in app.live_screen.gen_text


@pytest.mark.slow
async def test_escape_before_the_request_start_is_drained_still_says_cancelling(app, monkeypatch):
    """esc can come between the engine starting the request and the UI applying that start (its event waits
    for the next drain): the start must not clear what esc said."""
    in_first_step, finish_step = hold_first_step(monkeypatch)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        drain = app.drain_events
        monkeypatch.setattr(app, "drain_events", lambda flush=True: 0)  # the start's event waits, undrained
        future = app.start_generate(default_request(app.engine, prompt="a red cube", steps=4))
        assert await asyncio.to_thread(in_first_step.wait, 30)
        await pilot.press("escape")
        monkeypatch.setattr(app, "drain_events", drain)
        drain()  # now the start arrives, after esc
        await pilot.pause()
        assert CANCELLING in screen_text(app)
        finish_step.set()
        await finish(pilot, future, lambda: not app.generating)
        await until(pilot, lambda: CANCELLING not in screen_text(app))
        assert "cancelled after 1/4 steps" in app.live_screen.gen_text


@pytest.mark.slow
async def test_live_screen_toasts_stay_off_the_staging_log(app):
    async with app.run_test(size=(160, 48), notifications=True) as pilot:
        await pilot.pause()
        await load(pilot, app)
        app.say("a notice")
        await until(pilot, lambda: len(app.screen.query("Toast")) > 0)
        await pilot.pause()
        staging = app.live_screen.staging.region
        for toast in app.screen.query("Toast"):
            assert not toast.region.overlaps(staging), (toast.region, staging)
