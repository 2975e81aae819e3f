"""Host→device bandwidth for the forecast's transfer time: measured once, or observed from staging.

The measurement is one ~256 MiB pinned copy (after a warm-up copy), run on the engine worker
thread so the UI never waits on it. Observed staging events refine nothing when a measurement
exists; they stand in for it when the measurement could not run.
"""

from __future__ import annotations

import time

import torch

from ..offload.events import StagingEvent

MEASURE_BYTES = 256 * 1024 * 1024
MIN_OBSERVED_BYTES = 1 << 20  # small copies are latency-bound and would understate the link


def measure_h2d_bandwidth(device: torch.device, nbytes: int = MEASURE_BYTES) -> float | None:
    """Bytes per second of one pinned host→device copy of `nbytes`; None on CPU."""
    if device.type != "cuda":
        return None
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    try:
        dev[: 1 << 20].copy_(host[: 1 << 20], non_blocking=True)  # warm-up: context, copy engine
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
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
