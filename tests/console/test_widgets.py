"""Pilot tests of the console widgets with injected, deterministic data (no sleeps)."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import DataTable, Log

from omni_console.console.widgets import (
    HISTORY_SAMPLES,
    AllocatorPanel,
    FilterBar,
    HostPanel,
    ResidencyPanel,
    StagingLog,
    StepTimings,
    format_event,
)
from omni_console.engine.events import LoadProgress, StepTiming
from omni_console.offload.events import CacheDecision, ErrorEvent, LogEvent, OomRetry, StagingEvent
from omni_console.offload.telemetry import HostMemory, NvmlMemory, TelemetrySnapshot, TorchMemory
from omni_console.themes import CSS_PATH, DEFAULT_THEME, THEMES, register_themes

GB = 10**9


class WidgetApp(App):
    """A tiny host app: the widgets under test, the real stylesheet and themes."""

    CSS_PATH = CSS_PATH
    BINDINGS = [
        Binding("slash", "filter", "filter"),
        Binding("p", "pause", "pause"),
    ]

    def __init__(self, *widgets: Widget, theme: str = DEFAULT_THEME) -> None:
        super().__init__()
        self._widgets = widgets
        self._theme_name = theme

    def compose(self) -> ComposeResult:
        yield from self._widgets

    def on_mount(self) -> None:
        register_themes(self, activate=self._theme_name)

    def action_filter(self) -> None:
        self.query_one(StagingLog).open_filter()

    def action_pause(self) -> None:
        self.query_one(StagingLog).toggle_pause()


def screen_text(app: App) -> str:
    """What the terminal shows, as plain text."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def gpu_snapshot(t: float = 1.0, allocated: int = 3 * GB) -> TelemetrySnapshot:
    return TelemetrySnapshot(
        t=t,
        torch=TorchMemory(
            allocated=allocated,
            reserved=5 * GB,
            cached=5 * GB - allocated,
            peak=4_200_000_000,
            alloc_retries=2,
            free=100 * GB,
            total=150 * GB,
            device_name="NVIDIA H200",
        ),
        nvml=NvmlMemory(
            device_name="NVIDIA H200",
            total=150 * GB,
            used=12_300_000_000,
            free=137_700_000_000,
            reserved=560_000_000,
            pcie_rx_bytes_per_s=55_400_000_000,
            pcie_tx_bytes_per_s=None,
            gpu_util_pct=87,
            mem_util_pct=41,
            memory_api="v2",
            errors={"pcie_tx": "Not Supported"},
        ),
        host=HostMemory(
            rss=2_100_000_000,
            pinned_bytes=23_800_000_000,
            total=64 * GB,
            available=30 * GB,
            cgroup_limit=64 * GB,
            host_total=256 * GB,
        ),
    )


CPU_SNAPSHOT = TelemetrySnapshot(
    t=0.0,
    torch=TorchMemory(unavailable="no CUDA device (device is cpu)"),
    nvml=NvmlMemory(unavailable="NVML init failed: NVML Shared Library Not Found"),
    host=HostMemory(unavailable="psutil not installed: No module named 'psutil'"),
)


# --------------------------------------------------------------------------- AllocatorPanel


async def test_allocator_panel_shows_snapshot_values_with_design_labels():
    panel = AllocatorPanel()
    app = WidgetApp(panel)
    async with app.run_test(size=(120, 40)) as pilot:
        panel.update_snapshot(gpu_snapshot())
        await pilot.pause()
        text = screen_text(app)
        for label, value in [
            ("torch allocated (live tensors)", "3.0 GB"),
            ("torch reserved (caching allocator)", "5.0 GB"),
            ("cached = reserved − allocated", "2.0 GB"),
            ("torch peak (max allocated since reset)", "4.2 GB"),
            ("NVML used (all processes + context)", "12.3 GB"),
            ("NVML reserved (driver/firmware)", "560.0 MB"),
            ("NVML PCIe RX (host→GPU)", "55.4 GB/s"),
            ("free for us = NVML free + torch cached", "139.7 GB"),
        ]:
            line = next((ln for ln in text.splitlines() if label in ln), None)
            assert line is not None, f"{label!r} not on screen:\n{text}"
            assert value in line, f"{value!r} not next to {label!r}: {line!r}"
        assert "NVIDIA H200" in text
        assert "GB = 10^9 bytes" in text  # the unit convention is stated
        assert "NVML PCIe TX: Not Supported" in text  # per-field N/A reason in the notes
        assert panel.row("torch.alloc_retries").has_class("-alert")  # retries > 0 flagged
        assert "unavailable" not in text


async def test_allocator_panel_shows_unavailable_reasons_on_cpu():
    panel = AllocatorPanel()
    app = WidgetApp(panel)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "unavailable: no telemetry yet" in screen_text(app)
        panel.update_snapshot(CPU_SNAPSHOT)
        await pilot.pause()
        text = screen_text(app)
        assert "unavailable: no CUDA device (device is cpu)" in text
        assert "unavailable: NVML init failed: NVML Shared Library Not Found" in text
        assert "torch allocated (live tensors)" not in text  # rows of an N/A group are hidden
        line = next(ln for ln in text.splitlines() if "free for us" in ln)
        assert "N/A" in line
        assert panel.row("free_for_us").reason.startswith("torch cached: no CUDA device")


@pytest.mark.slow
async def test_allocator_history_is_bounded_and_feeds_the_sparkline():
    assert HISTORY_SAMPLES >= 1200  # two minutes at 10 Hz
    panel = AllocatorPanel()
    small = AllocatorPanel(history=5, id="small")
    app = WidgetApp(panel, small)
    async with app.run_test(size=(120, 40)) as pilot:
        for i in range(HISTORY_SAMPLES + 100):
            snap = gpu_snapshot(t=i / 10, allocated=(i % 5) * GB)
            panel.update_snapshot(snap)
            small.update_snapshot(snap)
        await pilot.pause()
        row = panel.row("torch.allocated")
        assert len(row.history) == HISTORY_SAMPLES
        assert row.history[-1] == float(((HISTORY_SAMPLES + 99) % 5) * GB)
        spark = row.query_one("Sparkline")
        assert len(spark.data) == HISTORY_SAMPLES
        assert list(small.row("nvml.used").history) == [12_300_000_000.0] * 5
        # a missing value adds no point (a gap never reads as zero)
        assert len(panel.row("nvml.pcie_tx").history) == 0


# --------------------------------------------------------------------------- HostPanel


async def test_host_panel_values_cgroup_note_and_unavailable():
    panel = HostPanel()
    app = WidgetApp(panel)
    async with app.run_test(size=(120, 40)) as pilot:
        panel.update_snapshot(gpu_snapshot())
        await pilot.pause()
        text = screen_text(app)
        assert "process RSS" in text and "2.1 GB" in text
        line = next(ln for ln in text.splitlines() if "pinned bytes held (engine)" in ln)
        assert "23.8 GB" in line
        assert "RAM limited by cgroup to 64.0 GB (host has 256.0 GB)" in text
        panel.update_snapshot(
            TelemetrySnapshot(t=1.0, host=HostMemory(rss=1, errors={"pinned_bytes": "arena gone"}))
        )
        await pilot.pause()
        assert "pinned bytes held (engine): N/A (arena gone)" in screen_text(app)
        panel.update_snapshot(CPU_SNAPSHOT)
        await pilot.pause()
        text = screen_text(app)
        assert "unavailable: psutil not installed" in text
        assert "process RSS" not in text


# --------------------------------------------------------------------------- StagingLog


def staging_events(t0: float = 100.0) -> list:
    return [
        StagingEvent(t=t0, target="text_encoder", direction="h2d", nbytes=9_500_000_000, seconds=0.2),
        StagingEvent(t=t0 + 0.5, target="vae", direction="h2d", nbytes=168_000_000, seconds=0.004, sync=True),
        CacheDecision(t=t0 + 1, action="release", reason="cached 40% > 25% of capacity", cached=60 * GB),
        OomRetry(t=t0 + 2, component="vae", nbytes=168_000_000, attempt=2, message="CUDA out of memory"),
        LogEvent(t=t0 + 3, level="warning", message="text_encoder kept resident"),
        ErrorEvent(t=t0 + 4, where="request 1", message="boom"),
    ]


def test_format_event_lines():
    ev = staging_events()
    lines = [format_event(e, 100.0) for e in ev]
    assert lines[0] == "+    0.000s H2D text_encoder  9.5 GB  0.2000 s    47.5 GB/s"
    assert lines[1].endswith("SYNC")
    assert "CACHE release: cached 40% > 25% of capacity  [cached 60.0 GB]" in lines[2]
    assert "OOM vae 168.0 MB — cache released, attempt 2: CUDA out of memory" in lines[3]
    assert "WARNING text_encoder kept resident" in lines[4]
    assert "ERROR request 1: boom" in lines[5]
    assert format_event(LoadProgress(component="vae", done_bytes=1, total_bytes=2)) is None


async def test_staging_log_shows_events_and_ignores_others():
    log = StagingLog()
    app = WidgetApp(log)
    async with app.run_test(size=(120, 40)) as pilot:
        assert log.add_events(staging_events()) == 6
        assert not log.add_event(LoadProgress(component="vae", done_bytes=1, total_bytes=2))
        await pilot.pause()
        text = screen_text(app)
        assert "staging events — live" in text
        assert "H2D text_encoder" in text and "ERROR request 1: boom" in text
        assert len(log.query_one(Log).lines) == 6


async def test_staging_log_filter_by_keyboard_and_api():
    log = StagingLog()
    app = WidgetApp(log)
    async with app.run_test(size=(120, 40)) as pilot:
        log.add_events(staging_events())
        await pilot.press("slash")
        bar = log.query_one(FilterBar)
        assert bar.has_focus and bar.display
        await pilot.press("V", "a", "e")
        await pilot.pause()
        shown = list(log.query_one(Log).lines)
        assert len(shown) == 2 and all("vae" in line for line in shown)
        assert log.filter_text == "Vae"
        assert "filter “Vae”" in screen_text(app)
        # new events obey the filter too
        log.add_event(StagingEvent(t=200.0, target="transformer_blocks.0", direction="h2d", nbytes=1, seconds=1))
        log.add_event(StagingEvent(t=201.0, target="vae", direction="d2h", nbytes=1, seconds=1))
        await pilot.pause()
        assert len(log.query_one(Log).lines) == 3
        await pilot.press("escape")  # clears and closes
        await pilot.pause()
        assert log.filter_text == "" and not bar.has_class("-open")
        assert len(log.query_one(Log).lines) == 8
        log.set_filter("[bold]")  # markup-looking text is shown literally, not parsed
        await pilot.pause()
        assert "filter “[bold]”" in screen_text(app)
        assert len(log.query_one(Log).lines) == 0


async def test_staging_log_pause_buffers_then_resumes_in_order():
    log = StagingLog(pause_buffer=3)
    app = WidgetApp(log)
    async with app.run_test(size=(120, 40)) as pilot:
        ev = staging_events()
        log.add_event(ev[0])
        await pilot.press("p")
        assert log.paused
        log.add_events(ev[1:3])
        await pilot.pause()
        assert len(log.query_one(Log).lines) == 1  # not shown while paused
        assert "staging events — paused (2 buffered)" in screen_text(app)
        log.add_events(ev[3:])  # 5 buffered into a buffer of 3: 2 lost, counted
        await pilot.pause()
        assert log.buffered == 3 and log.dropped == 2
        assert "paused (3 buffered) · 2 dropped" in screen_text(app)
        await pilot.press("p")
        await pilot.pause()
        assert not log.paused
        lines = list(log.query_one(Log).lines)
        assert len(lines) == 4
        assert "H2D text_encoder" in lines[0] and "ERROR request 1" in lines[-1]
        assert "staging events — live · 2 dropped" in screen_text(app)


async def test_staging_log_dropped_counter_in_title():
    log = StagingLog()
    app = WidgetApp(log)
    async with app.run_test(size=(120, 40)) as pilot:
        log.set_dropped(7)
        await pilot.pause()
        assert "staging events — live · 7 dropped" in screen_text(app)
        assert log.dropped == 7


# --------------------------------------------------------------------------- StepTimings


def steps(n: int, request_id: int = 1) -> list[StepTiming]:
    return [
        StepTiming(request_id=request_id, step=i + 1, total_steps=n, wall_s=0.5, stall_s=0.05, h2d_bytes=23_800_000_000)
        for i in range(n)
    ]


async def test_step_timings_table_summary_and_reset():
    widget = StepTimings(max_rows=4)
    app = WidgetApp(widget)
    async with app.run_test(size=(120, 40)) as pilot:
        for s in steps(6):
            widget.add_step(s)
        await pilot.pause()
        table = widget.query_one(DataTable)
        assert table.row_count == 4  # bounded
        assert table.get_row_at(3) == ["1", "6/6", "500.0 ms", "50.0 ms", "10", "2.00", "23.8 GB"]
        text = screen_text(app)
        assert "request 1 step 6/6" in text
        assert "median step (last 6) 500.0 ms" in text
        assert "stall 50.0 ms (10 %)" in text
        assert "copied 23.8 GB/step (47.6 GB/s)" in text
        assert len(widget.query_one("#wall-spark").data) == 6
        widget.reset()
        await pilot.pause()
        assert table.row_count == 0
        assert "no steps yet" in screen_text(app)


# --------------------------------------------------------------------------- ResidencyPanel


async def test_residency_panel_rows_totals_and_validation():
    panel = ResidencyPanel()
    app = WidgetApp(panel)
    async with app.run_test(size=(120, 40)) as pilot:
        panel.update_rows(
            [
                ("text_encoder", "resident", 9_500_000_000),
                ("transformer", "host", 23_800_000_000),
                ("vae", "device", 168_000_000),
            ]
        )
        await pilot.pause()
        text = screen_text(app)
        assert "text_encoder" in text and "resident" in text and "9.5 GB" in text
        assert "resident 9.5 GB · device 168.0 MB · host 23.8 GB" in text
        table = panel.query_one(DataTable)
        table.move_cursor(row=2)
        panel.update_rows(
            [
                ("text_encoder", "resident", 9_500_000_000),
                ("transformer", "in_flight", 23_800_000_000),
                ("vae", "device", 168_000_000),
            ]
        )
        await pilot.pause()
        assert table.cursor_row == 2  # same rows: updated in place
        text = screen_text(app)
        assert "in flight" in text and "device 168.0 MB" in text
        with pytest.raises(ValueError, match="unknown residency state 'gone'"):
            panel.update_rows([("vae", "gone", 1)])


# --------------------------------------------------------------------------- all together


def all_widgets() -> list[Widget]:
    return [AllocatorPanel(), HostPanel(), ResidencyPanel(), StepTimings(), StagingLog()]


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
@pytest.mark.parametrize("theme", sorted(THEMES))
async def test_every_widget_renders_at_small_and_large_sizes_in_every_theme(size, theme):
    widgets = all_widgets()
    app = WidgetApp(*widgets, theme=theme)
    async with app.run_test(size=size) as pilot:
        alloc, host, residency, timings, log = widgets
        for snap in (gpu_snapshot(), CPU_SNAPSHOT):
            alloc.update_snapshot(snap)
            host.update_snapshot(snap)
        residency.update_rows([("vae", "host", 1)])
        for s in steps(3):
            timings.add_step(s)
        log.add_events(staging_events())
        await pilot.pause()
        assert app.theme == theme
        text = screen_text(app)
        assert len(text.splitlines()) == size[1]
        assert "GPU memory" in text
        other = (200, 60) if size == (80, 24) else (80, 24)
        await pilot.resize_terminal(*other)
        await pilot.pause()
        assert len(screen_text(app).splitlines()) == other[1]


def test_themes_are_complete():
    assert DEFAULT_THEME == "omni-dark"
    assert {"omni-dark", "omni-light", "omni-high-contrast"} <= set(THEMES)
    assert THEMES["omni-light"].dark is False
    assert CSS_PATH.is_file() and CSS_PATH.suffix == ".tcss"


async def test_register_themes_rejects_unknown_theme():
    app = WidgetApp()
    async with app.run_test():
        with pytest.raises(ValueError, match="unknown theme"):
            register_themes(app, activate="no-such-theme")
