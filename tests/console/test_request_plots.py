"""The plots draw what the events said: known events in, the plotted values read back from the plot widgets'
own data (plotext's), at 80x24; the trace key writes the same request's trace under a new name."""

from __future__ import annotations

import json

import pytest
from textual.app import App

from omni_console.console.request_record import LINK_BIN_S, RequestRecord
from omni_console.console.screens.plots import PlotScreen
from omni_console.console.widgets.request_plots import LinkPlot, MemoryPlot, Series, thinned
from omni_console.engine.events import (
    RequestFinished,
    RequestPhases,
    RequestStarted,
    StagingEvent,
    StepTiming,
    TelemetryEvent,
)
from omni_console.offload.telemetry import HostMemory, NvmlMemory, TelemetrySnapshot, TorchMemory

GB = 10**9
T0 = 500.0


def known_events(rank: int | None = None) -> list:
    """A request: text encoding 0–1 s, steps 1–2 and 2–3 s, decode 3–3.5 s; memory samples every 0.5 s;
    copies of 2 GB at 1.0 s, 1 GB at 1.2 s and 4 GB at 2.1 s."""
    ev: list = [RequestStarted(t=T0, request_id=3, prompt="p", steps=2, height=64, width=64, seed=0, rank=rank)]
    for i in range(8):
        snap = TelemetrySnapshot(t=T0 + 0.5 * i, torch=TorchMemory(allocated=(2 + i) * GB, reserved=(3 + i) * GB),
                                 nvml=NvmlMemory(process_used=(4 + i) * GB), host=HostMemory(rss=GB))
        ev.append(TelemetryEvent(t=snap.t, snapshot=snap))
    for start, size in ((1.0, 2), (1.2, 1), (2.1, 4)):
        ev.append(StagingEvent(t=T0 + start, target="blocks.0", direction="h2d", nbytes=size * GB, seconds=0.1,
                               start=T0 + start, rank=rank))
    ev.append(StepTiming(t=T0 + 2.0, request_id=3, step=1, total_steps=2, wall_s=1.0, stall_s=0.25, rank=rank))
    ev.append(StepTiming(t=T0 + 3.0, request_id=3, step=2, total_steps=2, wall_s=1.0, stall_s=0.125, rank=rank))
    ev.append(RequestPhases(t=T0 + 3.6, request_id=3, frames=1, latent_shape=None, rank=rank,
                            phases={"text_encoding": 1.0, "denoise": 2.0, "vae_decode": 0.5}))
    ev.append(RequestFinished(t=T0 + 3.7, request_id=3, seconds=3.7, ok=True, rank=rank))
    return ev


def plotted(plot) -> dict[str, tuple[list[float], list[float]]]:
    """Each labelled series as plotext holds it (the widget's plot data, not what was handed to it)."""
    monitor = plot.plt._active.monitor
    return {label: (list(x), list(y)) for label, x, y in zip(monitor.label, monitor.x, monitor.y, strict=True)
            if label}


def vertical_lines(plot) -> list[float]:
    return sorted(x for xs in plot.plt._active.monitor.vcoord for x in xs)


class PlotApp(App[None]):
    def __init__(self, record: RequestRecord) -> None:
        super().__init__()
        self.record = record

    def on_mount(self) -> None:
        self.push_screen(PlotScreen(self.record))


async def test_the_plots_show_the_values_the_events_carried():
    record = RequestRecord()
    record.add_all(known_events())
    app = PlotApp(record)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, PlotScreen)
        memory = plotted(screen.query_one(MemoryPlot))
        times = [0.5 * i for i in range(8)]
        assert memory["allocated"] == (times, [2.0 + i for i in range(8)])
        assert memory["reserved"] == (times, [3.0 + i for i in range(8)])
        assert memory["NVML process"] == (times, [4.0 + i for i in range(8)])
        link = plotted(screen.query_one(LinkPlot))
        # 3 GB began in 1.0–1.5 s, 4 GB in 2.0–2.5 s: per 0.5 s slice, in GB/s
        assert link["link GB/s"] == ([0.0, 0.5, 1.0, 1.5, 2.0], [0, 0, 3 / LINK_BIN_S, 0, 4 / LINK_BIN_S])
        assert link["stall ms/step"] == ([1.5, 2.5], [250.0, 125.0])
        # text encoding, step 1, step 2, decode begin; the request ended: each a vertical line, on both plots
        assert vertical_lines(screen.query_one(MemoryPlot)) == pytest.approx([0.0, 1.0, 2.0, 3.0, 3.7])
        assert vertical_lines(screen.query_one(LinkPlot)) == pytest.approx([0.0, 1.0, 2.0, 3.0, 3.7])
        text = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
        assert "request 3 · done in" in text and "2/2 steps" in text
        assert "device memory (GB)" in text and "link GB/s" in text


async def test_a_rank_other_than_0_does_not_draw_and_a_new_request_starts_over():
    record = RequestRecord()
    record.add_all(known_events(rank=1))
    assert record.started is None and record.link().x == []
    record.add_all(known_events())
    record.add(RequestStarted(t=T0 + 10, request_id=4, prompt="", steps=1, height=1, width=1, seed=0))
    assert record.steps == [] and record.memory() == [] and record.link().x == []
    assert record.marks() == [] and record.started.request_id == 4


def test_thinning_keeps_each_groups_peak():
    series = Series("m", [float(i) for i in range(10)], [0, 5, 0, 0, 0, 0, 9, 0, 0, 1])
    assert thinned(series, 5) == Series("m", [0.0, 2.0, 4.0, 6.0, 8.0], [5, 0, 0, 9, 1])
    assert thinned(series, 20) is series


@pytest.mark.parametrize("finished", [True, False])
def test_the_trace_key_writes_a_new_file_each_time(tmp_path, finished):
    from omni_console.console.outputs import save_trace

    record = RequestRecord()
    record.add_all(known_events() if finished else known_events()[:-1])
    first = save_trace(record.trace(), tmp_path, 3, when=0)
    second = save_trace(record.trace(), tmp_path, 3, when=0)
    assert first != second and first.name.endswith("-request-3-trace.json")
    trace = json.loads(first.read_text())
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "step"]
    assert [(s["name"], s["ts"], s["dur"]) for s in steps] == [("step 1/2", 1e6, 1e6), ("step 2/2", 2e6, 1e6)]


def test_help_lists_the_plot_and_trace_keys():
    from omni_console.console.key_help import help_sections

    sections = dict(help_sections([], "ctrl+p", lambda b: b.key))
    live = dict(sections["live screen (after load)"])
    assert "plots of the request" in live["v"] and "trace" in live["e"]
    plots = dict(sections["plots (after v)"])
    assert "trace" in plots["e"] and set(plots) == {"e", "escape / v"}
