"""Quitting without waiting for the engine: release queued behind the command in flight, key reader stopped.

A step of a big video model can run for minutes inside one kernel, so quitting never joins the
engine thread: telemetry stops, the worker is cancelled and its release (`engine.close()`) is queued
behind whatever runs (`EngineWorker.request_shutdown`); the app gives the terminal back at once, and
whoever ends the process waits a bounded time for the release (`app_main.run_app`).

When the process ends right after (`collect = False`, set by `run_app`), the loaded model stays
frozen for the collector: `engine.close()` still frees its arenas and device memory explicitly, but
its `gc.collect()` no longer walks the whole model and UI. That pass holds the GIL (0.8 s measured
on the 2-core machine under load), so neither the UI nor the process's exit could run meanwhile.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
from concurrent.futures import Future
from typing import Any

from ..engine.api import probes, service

SAMPLER_STOP_S = 0.3


class EngineRelease:
    """Stops telemetry and queues the engine's release, once (every later call returns the same future)."""

    def __init__(self, worker: service.EngineWorker, sampler: probes.TelemetrySampler, subscription: Any) -> None:
        self.worker = worker
        self.sampler = sampler
        self.subscription = subscription
        self.released: Future[None] | None = None
        self.collect = True
        """Unfreeze the collector first, so the released model's cycles are collected (a process that
        goes on); False when the process ends next and the OS takes the memory back."""

    @property
    def started(self) -> bool:
        return self.released is not None

    def begin(self) -> Future[None]:
        """Never waits: the future completes on the engine thread once `engine.close()` has run."""
        if self.released is None:
            if self.collect:
                gc.unfreeze()  # the model's objects must be collectable when the engine drops them
            self.sampler.stop(timeout=SAMPLER_STOP_S)
            self.sampler.close()
            self.released = self.worker.request_shutdown()
            self.subscription.close()
        return self.released

    def wait(self, timeout: float | None) -> bool:
        """`begin()`, then wait at most `timeout` s; True when the release is done."""
        released = self.begin()
        concurrent.futures.wait([released], timeout=timeout)
        return released.done()


def stop_key_reader(driver: Any, headless: bool) -> None:
    """Stop the terminal driver's key-reading thread now that nothing reads keys.

    On the way out Textual's Linux driver joins that thread, which polls in 0.1 s selects and
    sleeps one more after its last: about 200 ms of a 300 ms quit. With its exit event already
    set the driver skips the join (Textual's own check); mouse reporting is switched off here
    instead, since the driver then skips that too.
    """
    exit_event = getattr(driver, "exit_event", None)
    if driver is None or headless or exit_event is None or exit_event.is_set():
        return
    with contextlib.suppress(Exception):
        driver._disable_mouse_support()
        driver.flush()
    exit_event.set()


def release_wait_s(engine: Any, wait_s: float) -> float:
    """How long the process waits for the engine's release once the terminal is back.

    Nothing, when one in-process engine holds nothing (the plan screen): there is nothing to free, and
    the release would sit behind the model classes' import (`prepare`), which nothing interrupts: that
    was 0.8 s of a 1 s quit on an idle console. A rank group always gets the wait (its release stops
    the rank processes), as does an engine that is loading or loaded.
    """
    from ..engine.api import service

    state = service.EngineState
    holds_nothing = engine.state in (state.DISCOVERED, state.UNLOADED, state.FAILED)
    return 0.0 if holds_nothing and engine.world <= 1 else wait_s
