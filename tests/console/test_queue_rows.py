"""The queue panel's rows follow the request service's events (no Textual, no engine)."""

from __future__ import annotations

from types import SimpleNamespace

from omni_console.console.request_commands import free_output
from omni_console.console.request_queue import QueueRows, row_cells
from omni_console.engine.service.events import (
    QueueReordered,
    RequestCancelled,
    RequestDone,
    RequestFailed,
    RequestQueued,
    RequestRunning,
)


def request(prompt: str, width: int | None = 64, frames: int | None = None):
    return SimpleNamespace(prompt=prompt, width=width, height=width, frames=frames)


def test_rows_follow_queued_running_reordered_and_ended_requests():
    rows = QueueRows()
    rows.added(1, request("a\x1b[2Jfox"))  # data: shown escaped, never as a control sequence
    rows.added(2, request("b", frames=9))
    rows.added(3, request("c", width=None))
    assert rows.apply([RequestQueued(ticket=n, position=n - 1, prompt="?") for n in (1, 2, 3)])
    assert rows.apply([RequestRunning(ticket=1)])
    assert [(r.ticket, r.state) for r in rows.shown()] == [(1, "running"), (2, "queued"), (3, "queued")]
    assert "\x1b" not in rows.shown()[0].prompt and [r.size for r in rows.shown()] == ["64x64", "64x64x9", "default"]
    rows.apply([QueueReordered(tickets=(3, 2))])
    assert [r.ticket for r in rows.shown()] == [1, 3, 2]
    rows.apply([RequestCancelled(ticket=3, running=False), RequestDone(ticket=1, files=(), seconds=1.0)])
    assert [r.ticket for r in rows.shown()] == [2] and rows.running is None
    rows.apply([RequestRunning(ticket=2), RequestFailed(ticket=2, error="boom")])
    assert rows.shown() == [] and not rows.apply([])


def test_a_row_shows_the_engines_forecast_once_it_has_answered():
    rows = QueueRows()
    rows.added(4, request("d"))
    rows.apply([RequestQueued(ticket=4, position=0, prompt="d")])
    assert row_cells(1, rows.shown()[0])[4:] == ("…", "…")
    rows.forecast(4, SimpleNamespace(step_s=0.25, peak_bytes=1_500_000_000))
    assert row_cells(1, rows.shown()[0]) == ("1", "queued", "d", "64x64", "250.0 ms", "1.5 GB")
    rows.forecast(4, None)  # the engine could not forecast it
    assert row_cells(1, rows.shown()[0])[4:] == ("unknown", "unknown")


def test_an_output_name_is_never_one_that_exists(tmp_path, monkeypatch):
    from omni_console.console import outputs

    monkeypatch.setattr(outputs, "now", lambda: 1_700_000_000.0)
    first = free_output(tmp_path, "FluxPipeline", 5)
    first.write_bytes(b"taken")
    second = free_output(tmp_path, "FluxPipeline", 5)
    assert first.suffix == ".png" and second.name == first.stem + "-2.png"
    assert free_output(tmp_path, "WanPipeline", 5).suffix == ".mp4"
