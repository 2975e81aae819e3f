"""Shared pieces of the app pilot tests: deterministic telemetry sources, app factory, waits."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from textual.app import App
from textual.pilot import Pilot

from omni_console.console.app import OmniConsoleApp
from omni_console.engine.engine import Engine
from omni_console.engine.running.runner import StepClock
from omni_console.offload.policy import OffloadPolicy, build_policy
from omni_console.offload.telemetry import HostMemory, NvmlMemory, TorchMemory

GB = 10**9


class FixedSource:
    """A telemetry source that returns the same reading every time (no hardware)."""

    def __init__(self, value: TorchMemory | NvmlMemory | HostMemory) -> None:
        self.value = value
        self.reads = 0

    def read(self) -> TorchMemory | NvmlMemory | HostMemory:
        self.reads += 1
        return self.value


def gpu_sources() -> list[FixedSource]:
    return [
        FixedSource(TorchMemory(allocated=3 * GB, reserved=5 * GB, cached=2 * GB, peak=4_200_000_000,
                                alloc_retries=0, free=100 * GB, total=150 * GB, device_name="NVIDIA H200")),
        FixedSource(NvmlMemory(device_name="NVIDIA H200", total=150 * GB, used=12_300_000_000,
                               free=137_700_000_000, reserved=560_000_000, pcie_rx_bytes_per_s=55_400_000_000,
                               pcie_tx_bytes_per_s=1_000_000, gpu_util_pct=87, mem_util_pct=41,
                               memory_api="v2")),
        FixedSource(HostMemory(rss=2_100_000_000, pinned_bytes=3_600_000, total=64 * GB, available=30 * GB)),
    ]


def make_app(engine: Engine, tmp_path: Path, policy: OffloadPolicy | None = None, **kwargs) -> OmniConsoleApp:
    kwargs.setdefault("sources", gpu_sources())
    return OmniConsoleApp(engine, policy or build_policy(), out_dir=tmp_path / "out", **kwargs)


def screen_text(app: App) -> str:
    """What the terminal shows, as plain text."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def until(pilot: Pilot, condition: Callable[[], bool], limit: int = 200) -> None:
    """Let the app process messages until `condition` holds (bounded; no sleeps)."""
    for _ in range(limit):
        if condition():
            return
        await pilot.pause()
    raise AssertionError("condition not reached")


async def forecast_shown(pilot: Pilot, app: OmniConsoleApp, limit_s: float = 60.0) -> None:
    """Wait until the plan screen shows the engine thread's request forecast for what it shows now (it is
    computed there, behind whatever the worker runs first: the model's imports when the app opens)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while app.forecast_pending:
        assert loop.time() < deadline, "the engine thread's request forecast did not arrive"
        await pilot.pause(0.01)
    await pilot.pause()


async def finish(pilot: Pilot, future: Future, condition: Callable[[], bool]) -> None:
    """Wait for a worker command's future (success or failure), then for the app to apply its outcome."""
    waited = asyncio.wrap_future(future)
    await asyncio.wait([waited])
    if not waited.cancelled():
        # Retrieved here, so asyncio does not log "exception was never retrieved" when the wrapper
        # is collected: that log can fire inside another ast.parse (pytest's assertion rewriting) and
        # Python 3.11's traceback formatting parses too, which corrupts ast's recursion counter.
        waited.exception()
    await until(pilot, condition)


async def load(pilot: Pilot, app: OmniConsoleApp) -> None:
    """Press l and wait until the live screen shows (a second load's future is a new one: wait for it)."""
    before = app.last_command.get("load")
    await pilot.press("l")
    await until(pilot, lambda: app.last_command.get("load") is not before)
    await finish(pilot, app.last_command["load"], lambda: app.phase == "live" and app.screen is app.live_screen)


async def press_quit(pilot: Pilot, app: App, key: str = "q", limit_s: float = 30.0) -> None:
    """Press `key` (q, ctrl+q) and wait until the app has exited.

    q exits at once (the release is waited for by the process afterwards), so the pilot's own wait after
    a key can be left waiting on widgets that are gone (`WaitForScreenTimeout`): the press runs as a task.
    """
    press = asyncio.create_task(pilot.press(key))
    deadline = asyncio.get_running_loop().time() + limit_s
    while app.return_value is None and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    press.cancel()
    assert app.return_value is not None, f"{key} did not end the app within {limit_s} s"


def hold_first_step(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """(in_first_step, release): the first step to end waits on the engine thread until the test sets `release`,
    having set `in_first_step` (a slow step, or a first request that is certainly running while the test looks)."""
    in_first_step, release = threading.Event(), threading.Event()
    real_step_end = StepClock.on_step_end

    def held_step_end(self, pipe, step, timestep, kwargs):
        if not in_first_step.is_set():
            in_first_step.set()
            assert release.wait(30)
        return real_step_end(self, pipe, step, timestep, kwargs)

    monkeypatch.setattr(StepClock, "on_step_end", held_step_end)
    return in_first_step, release
