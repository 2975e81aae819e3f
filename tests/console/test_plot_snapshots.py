"""Snapshot tests: the plot screen (v) of a known request at 80x24 and 160x48, in the console's theme."""

from __future__ import annotations

import pytest
from test_request_plots import known_events
from textual.app import App

from omni_console.console.request_record import RequestRecord
from omni_console.console.screens.plots import PlotScreen
from omni_console.themes import CSS_PATH, register_themes

SIZES = [(80, 24), (160, 48)]


class ThemedPlotApp(App[None]):
    CSS_PATH = CSS_PATH

    def __init__(self, record: RequestRecord) -> None:
        super().__init__()
        self.record = record

    def on_mount(self) -> None:
        register_themes(self, activate="omni-dark")
        self.push_screen(PlotScreen(self.record))


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_plot_screen_snapshot(snap_compare, size):
    record = RequestRecord()
    record.add_all(known_events())
    async def settled(pilot) -> None:
        """The plots as the screen's refresh timer draws them at the laid-out size (its first draw may come
        before the final layout; the next tick, 0.5 s later, redraws): one more redraw, so no timing decides."""
        await pilot.pause()
        pilot.app.screen.redraw()
        await pilot.pause()

    assert snap_compare(ThemedPlotApp(record), terminal_size=size, run_before=settled)
