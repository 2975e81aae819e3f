"""Host→device bandwidth for the forecast's transfer time, observed from staging events.

The measurement itself is a device probe (`engine.device_probes.measure_h2d_bandwidth`, on the engine's
worker); observed staging events refine nothing when a measurement exists, and stand in for it when
the measurement could not run.
"""

from __future__ import annotations

from ..engine import events

MIN_OBSERVED_BYTES = 1 << 20  # small copies are latency-bound and would understate the link


class ObservedBandwidth:
    """Bytes-weighted mean rate of asynchronous host→device staging copies seen on a GPU."""

    def __init__(self) -> None:
        self.bytes = 0
        self.seconds = 0.0

    def observe(self, event: events.StagingEvent) -> None:
        if event.direction == "h2d" and not event.sync and event.seconds > 0 and event.nbytes >= MIN_OBSERVED_BYTES:
            self.bytes += event.nbytes
            self.seconds += event.seconds

    @property
    def rate(self) -> float | None:
        return self.bytes / self.seconds if self.seconds > 0 else None
