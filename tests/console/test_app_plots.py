"""The console's plots and trace key on a real request (the demo model on a CPU): v opens the plots at 80x24
with the request's steps and memory drawn from the events it received, e writes its trace, esc goes back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from app_helpers import finish, load, screen_text, until
from textual.widgets import Input

from omni_console.console.screens import GenerateDialog, LiveScreen
from omni_console.console.widgets.request_plots import LinkPlot, MemoryPlot

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from trace_format import Complete, TraceFile, check_nesting  # noqa: E402


@pytest.mark.slow
async def test_v_plots_the_request_and_e_writes_its_trace(app, tmp_path):
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        await pilot.press("e")  # no request yet: said, nothing written
        assert app.notices[-1][0] == "no request yet: nothing to trace"
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, GenerateDialog))
        app.screen.query_one("#steps", Input).value = "2"
        await pilot.press("enter")
        await finish(pilot, app.last_command["generate"], lambda: not app.generating)
        await until(pilot, lambda: app.router.record.finished is not None)
        for _ in range(2):  # the injected sources are sampled by hand: the fixture's 3 GB allocated, 5 GB reserved
            app.sampler.sample_now(publish=True)
        app.drain_events()

        await pilot.press("v")
        await until(pilot, lambda: app.screen.query(MemoryPlot) and app.screen.query_one(LinkPlot).series)
        record = app.router.record
        link = app.screen.query_one(LinkPlot)
        stalls = next(s for s in link.series if s.label == "stall ms/step")
        assert stalls.y == [s.stall_s * 1000 for s in record.steps] and len(stalls.y) == 2
        memory = {s.label: s.y for s in app.screen.query_one(MemoryPlot).series}
        assert memory == {"allocated": [3.0, 3.0], "reserved": [5.0, 5.0]}  # NVML's fixture lists no process
        text = screen_text(app)
        assert "request 1 · done in" in text and "2/2 steps" in text and "device memory (GB)" in text

        await pilot.press("e")
        message = app.notices[-1][0]
        assert message.startswith("trace of request 1: ") and "ui.perfetto.dev" in message
        [trace_file] = (tmp_path / "out").glob("*-request-1-trace.json")
        trace = TraceFile.model_validate_json(trace_file.read_text())
        check_nesting(trace)
        steps = [e for e in trace.traceEvents if isinstance(e, Complete) and e.cat == "step"]
        assert [e.name for e in steps] == ["step 1/2", "step 2/2"]
        assert any(isinstance(e, Complete) and e.cat == "compute" for e in trace.traceEvents)

        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, LiveScreen))
