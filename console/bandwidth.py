"""Host→device bandwidth for the forecast's transfer time: measured once, or observed from staging.

The measurement copies a 256 MiB pinned buffer the way the streamer does (asynchronously, from
page-locked memory) and keeps the best of several copies after a full-size warm-up: a single first
copy pays for mapping the buffer and reads about a third of the link's rate. It runs on the engine
worker thread so the UI never waits on it. Observed staging events refine nothing when a measurement
exists; they stand in for it when the measurement could not run.
"""

from __future__ import annotations

import time

import torch

from ..engine.events import StagingEvent

MEASURE_BYTES = 256 * 1024 * 1024
REPEATS = 4
MIN_OBSERVED_BYTES = 1 << 20  # small copies are latency-bound and would understate the link


def measure_h2d_bandwidth(device: torch.device, nbytes: int = MEASURE_BYTES) -> float | None:
    """Bytes per second of one pinned host→device copy of `nbytes`; None on CPU."""
    if device.type != "cuda":
        return None
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    try:
        dev.copy_(host, non_blocking=True)  # warm-up at full size: context, copy engine, page mapping
        torch.cuda.synchronize(device)
        seconds = float("inf")
        for _ in range(REPEATS):
            start = time.perf_counter()
            dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize(device)
            seconds = min(seconds, time.perf_counter() - start)
    finally:
        del host, dev
        torch.cuda.empty_cache()
    return nbytes / seconds if seconds > 0 else None


class ObservedBandwidth:
    """Bytes-weighted mean rate of asynchronous host→device staging copies seen on a GPU."""

    def __init__(self) -> None:
        self.bytes = 0
        self.seconds = 0.0

    def observe(self, event: StagingEvent) -> None:
        if event.direction == "h2d" and not event.sync and event.seconds > 0 and event.nbytes >= MIN_OBSERVED_BYTES:
            self.bytes += event.nbytes
            self.seconds += event.seconds

    @property
    def rate(self) -> float | None:
        return self.bytes / self.seconds if self.seconds > 0 else None
