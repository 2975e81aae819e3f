"""Snapshot tests: the live screen's queue panel (a running request and three waiting, one forecast not
answered yet, one the engine cannot forecast) at 80x24 and 160x48, focused (its keys in its title)."""

from __future__ import annotations

import pytest
from test_snapshots import SIZES, settle_live, stable_app, stable_engine  # noqa: F401 - the fixture

from omni_console.console.request_queue import QueueRow

ROWS = [
    QueueRow(1, "a red fox in the snow", "64x64", "running", 0.25, 1_500_000_000, True),
    QueueRow(2, "a lighthouse at dusk, " * 4, "1024x1024", "queued", 2.5, 38_000_000_000, True),
    QueueRow(4, "a paper boat", "512x768", "queued", None, None, True),
    QueueRow(3, "a teapot", "64x64x9", "queued"),
]


async def settle_queue(pilot) -> None:
    await settle_live(pilot)
    live = pilot.app.live_screen
    live.show_queue(ROWS)
    live.queue.focus()
    await pilot.press("down")  # the selection on the first waiting request
    await pilot.pause()


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_queue_panel_snapshot(snap_compare, stable_engine, tmp_path, size):  # noqa: F811 - the fixture
    app = stable_app(stable_engine, tmp_path, "omni-dark")
    try:
        assert snap_compare(app, terminal_size=size, run_before=settle_queue)
    finally:
        app.shutdown()
