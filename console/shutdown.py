"""Quitting without waiting for the engine: release queued behind the command in flight, key reader stopped.

A step of a big video model can run for minutes inside one kernel, so quitting never joins the
engine thread: telemetry stops, the worker is cancelled and its release (`engine.close()`) is queued
behind whatever runs (`EngineWorker.request_shutdown`); the app waits a bounded time for it and exits.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
from concurrent.futures import Future
from typing import Any

from ..engine.api import EngineWorker, TelemetrySampler

SAMPLER_STOP_S = 0.3


class EngineRelease:
    """Stops telemetry and queues the engine's release, once (every later call returns the same future)."""

    def __init__(self, worker: EngineWorker, sampler: TelemetrySampler, subscription: Any) -> None:
        self.worker = worker
        self.sampler = sampler
        self.subscription = subscription
        self.released: Future[None] | None = None

    @property
    def started(self) -> bool:
        return self.released is not None

    def begin(self) -> Future[None]:
        """Never waits: the future completes on the engine thread once `engine.close()` has run."""
        if self.released is None:
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
