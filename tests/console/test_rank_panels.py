"""The live screen of a multi-GPU group: one line per rank, and the staging log narrowed to one rank."""

from __future__ import annotations

import pytest
from app_helpers import GB, load, screen_text, until

from omni_console.console.rank_stats import RankStats
from omni_console.console.screens.live import RANK_BINDING
from omni_console.console.widgets.filter_bar import FilterBar
from omni_console.console.widgets.gpu_group_panel import GpuGroupPanel, rank_line
from omni_console.engine.events import StepTiming
from omni_console.offload.events import LogEvent, StagingEvent, TelemetryEvent
from omni_console.offload.telemetry import NvmlMemory, TelemetrySnapshot, TorchMemory


def gpu_sample(allocated: int, reserved: int, used: int, rx: int) -> TelemetrySnapshot:
    return TelemetrySnapshot(
        t=1.0,
        torch=TorchMemory(allocated=allocated, reserved=reserved),
        nvml=NvmlMemory(total=141 * GB, used=used, pcie_rx_bytes_per_s=rx, pcie_tx_bytes_per_s=100_000_000),
    )


def stats(rank: int, snapshot: TelemetrySnapshot | None, steps: list[tuple[float, float]] = ()) -> RankStats:
    s = RankStats(rank, snapshot=snapshot)
    for n, (wall, stall) in enumerate(steps, 1):
        s.add_step(StepTiming(request_id=3, step=n, total_steps=20, wall_s=wall, stall_s=stall))
    return s


# ---- the line of one rank ----------------------------------------------------------------------


def test_a_wide_line_says_every_number_of_the_rank():
    line = rank_line(stats(1, gpu_sample(12_300_000_000, 14 * GB, 30_100_000_000, 12_300_000_000),
                           [(0.30, 0.02)] * 6 + [(0.25, 0.01)]), width=200)
    assert line == ("GPU 1  alloc 12.3 GB · res 14.0 GB · NVML 30.1/141 GB · PCIe ↓12.3 ↑0.1 GB/s · "
                    "step 7/20 0.25 s (stall 0.01) · mean 0.29 s (stall 0.02)")


def test_nvlink_rates_follow_pcie_where_nvml_reports_them():
    from dataclasses import replace

    sample = gpu_sample(12_300_000_000, 14 * GB, 30_100_000_000, 3_000_000_000)
    sample = replace(sample, nvml=replace(sample.nvml, nvlink_rx_bytes_per_s=52_000_000_000,
                                          nvlink_tx_bytes_per_s=51_500_000_000))
    line = rank_line(stats(0, sample, [(0.25, 0.01)]), width=200)
    assert "PCIe ↓3.0 ↑0.1 GB/s · NVLink ↓52.0 ↑51.5 GB/s · step 1/20" in line


@pytest.mark.parametrize("width", [76, 60, 40, 12])
def test_a_narrow_line_drops_the_least_telling_fields_before_it_is_cut(width):
    line = rank_line(stats(1, gpu_sample(12_300_000_000, 14 * GB, 30_100_000_000, 12_300_000_000),
                           [(0.25, 0.01)] * 7), width=width)
    assert len(line) <= width and line.startswith("GPU 1"[:width - 1])
    if width >= 60:
        assert "step 7/20 0.25 s (stall 0.01)" in line and "alloc 12.3 GB" in line
        assert "mean" not in line and "res " not in line  # dropped first
    if width == 76:
        assert "PCIe ↓12.3 ↑0.1 GB/s" in line


def test_missing_numbers_read_as_a_dash_or_are_left_out():
    no_nvml = TelemetrySnapshot(t=1.0, torch=TorchMemory(allocated=None, reserved=None),
                                nvml=NvmlMemory(unavailable="NVML library not found"))
    assert rank_line(stats(2, no_nvml), width=200) == "GPU 2  alloc — · NVML n/a"
    assert rank_line(stats(3, None), width=200) == "GPU 3  no telemetry yet"
    only_steps = rank_line(stats(0, None, [(1.5, 0.2)]), width=200)
    assert only_steps == "GPU 0  step 1/20 1.50 s (stall 0.20)"
    no_rates = TelemetrySnapshot(t=1.0, torch=TorchMemory(unavailable="no CUDA"), nvml=NvmlMemory(used=5 * GB))
    assert rank_line(stats(1, no_rates), width=200) == "GPU 1  torch n/a · NVML 5.0 GB"


# ---- the live screen ------------------------------------------------------------------------------


def publish_group_events(engine) -> None:
    """What two ranks and the leader publish during a request (events as the rank group forwards them)."""
    bus = engine.bus
    bus.publish(TelemetryEvent(snapshot=gpu_sample(12_300_000_000, 14 * GB, 30_100_000_000, 12_300_000_000), rank=0))
    bus.publish(TelemetryEvent(snapshot=gpu_sample(7_500_000_000, 9 * GB, 20_000_000_000, 3_000_000_000), rank=1))
    for rank, wall in ((0, 0.25), (1, 0.75)):
        bus.publish(StepTiming(request_id=1, step=7, total_steps=20, wall_s=wall, stall_s=0.01, rank=rank))
        bus.publish(StagingEvent(target=f"block.{rank}", direction="h2d", nbytes=2**20, seconds=0.01, rank=rank))
    bus.publish(LogEvent(level="info", message="leader says hello"))


@pytest.mark.slow
async def test_a_group_shows_a_line_per_gpu_and_r_narrows_the_staging_log(app, engine, monkeypatch):
    monkeypatch.setattr(type(engine), "world", 2)
    async with app.run_test(size=(80, 30)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        live = app.live_screen
        publish_group_events(engine)
        app.sampler.sample_now(publish=True)  # the console's own sample (rank None)
        app.drain_events()
        await pilot.pause()
        panel = live.query_one(GpuGroupPanel)
        gpu0, gpu1 = panel.lines
        assert gpu0.startswith("GPU 0  alloc 12.3 GB") and "step 7/20 0.25 s (stall 0.01)" in gpu0
        assert gpu1.startswith("GPU 1  alloc 7.5 GB") and "step 7/20 0.75 s (stall 0.01)" in gpu1
        assert all(len(line) <= 76 for line in panel.lines)
        text = screen_text(app)
        assert gpu0 in text and gpu1 in text, text
        # the main memory panel still shows the console's own sample (3 GB allocated), not a rank's
        assert live.allocator.row("torch.allocated").text == "3.0 GB"
        # the step table has rank 0's step once, not one per rank
        assert [(s.rank, s.wall_s) for s in live.steps.steps] == [(0, 0.25)]

        log = live.staging
        assert any(line.startswith("r0 ") and "block.0" in line for line in log.visible_lines)
        assert any(line.startswith("r1 ") and "block.1" in line for line in log.visible_lines)
        await until(pilot, lambda: "rank" in screen_text(app).splitlines()[-1])  # the footer offers the key
        bar = log.query_one(FilterBar)
        assert bar.border_title == "rank: all"
        await pilot.press(RANK_BINDING.key)
        assert log.rank_filter == 0 and bar.border_title == "rank: 0" and "rank 0" in str(log.border_title)
        assert not any(line.startswith("r1 ") for line in log.visible_lines)
        assert any(line.startswith("r0 ") for line in log.visible_lines)
        assert any("leader says hello" in line for line in log.visible_lines)  # this process's lines stay
        await pilot.press(RANK_BINDING.key)
        assert log.rank_filter == 1 and bar.border_title == "rank: 1"
        assert not any(line.startswith("r0 ") for line in log.visible_lines)
        assert any(line.startswith("r1 ") and "block.1" in line for line in log.visible_lines)
        await pilot.press(RANK_BINDING.key)
        assert log.rank_filter is None and bar.border_title == "rank: all"
        assert {line[:3] for line in log.visible_lines if line.startswith("r")} == {"r0 ", "r1 "}


@pytest.mark.slow
async def test_a_single_engine_has_no_group_panel_and_no_rank_key(app, engine):
    assert engine.world == 1
    async with app.run_test(size=(80, 30)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        live = app.live_screen
        assert not live.query(GpuGroupPanel)
        assert RANK_BINDING.key not in live.active_bindings
        assert "rank" not in screen_text(app).splitlines()[-1]
        await pilot.press(RANK_BINDING.key)
        assert live.staging.rank_filter is None and not live.staging.query_one(FilterBar).border_title


def test_help_lists_the_rank_key_for_a_group_only():
    from omni_console.console.key_help import help_sections

    def live_rows(world: int) -> list[tuple[str, str]]:
        sections = dict(help_sections([], "ctrl+p", lambda b: b.key, world))
        return sections["live screen (after load)"]

    assert not any(key == "r" for key, _ in live_rows(1))
    assert any(key == "r" and "rank" in text for key, text in live_rows(2))
