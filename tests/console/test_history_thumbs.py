"""The history screen's thumbnail: the selected request's output, when it is a file in the console's output
folder; a path the history names elsewhere (the history is cache input) is never opened."""

from __future__ import annotations

from app_helpers import until
from PIL import Image
from textual.app import App

from omni_console.console.output_frames import thumbnail_path
from omni_console.console.screens import HistoryScreen
from omni_console.console.widgets.halfblock import UPPER_HALF
from omni_console.engine.service.history import HistoryEntry, HistoryRequest


def entry(ticket: int, files: list[str]) -> HistoryEntry:
    return HistoryEntry(ticket=ticket, finished_at="2026-12-05T21:00:00+00:00", model="demo-flux",
                        request=HistoryRequest(prompt=f"request {ticket}", width=64, height=64, steps=2,
                                               output="x.png"),
                        policy={"mode": "dlo"}, status="done", error="", step_s=0.25, peak_bytes=None, files=files)


def test_only_files_inside_the_output_folder_are_opened(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    inside, outside = out / "a.png", tmp_path / "b.png"
    for path in (inside, outside):
        Image.new("RGB", (8, 8)).save(path)
    (out / "link.png").symlink_to(outside)
    assert thumbnail_path([str(inside)], out) == inside.resolve()
    assert thumbnail_path([str(outside)], out) is None
    assert thumbnail_path([str(out / "link.png")], out) is None  # resolves outside
    assert thumbnail_path([str(out / ".." / "b.png")], out) is None
    assert thumbnail_path([str(out / "missing.png")], out) is None
    assert thumbnail_path([], out) is None


async def test_the_selected_rows_output_shows_as_a_thumbnail(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(out / "fox.png")
    Image.new("RGB", (32, 32), (30, 30, 200)).save(tmp_path / "elsewhere.png")
    screen = HistoryScreen([entry(1, [str(tmp_path / "elsewhere.png")]), entry(2, [str(out / "fox.png")])],
                           out_dir=out)

    class Host(App):
        def on_mount(self) -> None:
            self.push_screen(screen)

    async with Host().run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: screen.thumb.display)  # the newest row (2) is selected first
        assert screen.thumb.border_title == "output · fox.png"
        text = "\n".join(strip.text for strip in pilot.app.screen._compositor.render_strips())
        assert UPPER_HALF in text
        await pilot.press("down")  # row 1: its file is outside the output folder
        await until(pilot, lambda: not screen.thumb.display)
        assert screen.thumb_path is None
