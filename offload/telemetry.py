"""Memory telemetry: the sampler that reads every source on a background thread.

The value types live in telemetry_types.py and the sources in telemetry_sources.py; both are
re-exported here, so `omni_console.offload.telemetry` stays the one import for engine/ and
console/. How the numbers read (labels, N/A reasons, report lines) is console/telemetry_text.py.
Torch only; this module never imports Textual.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from .events import EventBus, TelemetryEvent
from .telemetry_sources import (
    HostSource,
    NvmlSource,
    TorchMemorySource,
    default_sources,
    nvml_target_for,
    parse_cgroup_limit,
    read_cgroup_limit,
)
from .telemetry_types import (
    DEFAULT_HZ,
    NO_SOURCE,
    HostMemory,
    NvmlMemory,
    Source,
    TelemetrySnapshot,
    TorchMemory,
)
from .telemetry_types import reason_of as _reason

__all__ = [
    "DEFAULT_HZ",
    "MAX_HZ",
    "NO_SOURCE",
    "HostMemory",
    "HostSource",
    "NvmlMemory",
    "NvmlSource",
    "Source",
    "TelemetrySampler",
    "TelemetrySnapshot",
    "TorchMemory",
    "TorchMemorySource",
    "default_sources",
    "nvml_target_for",
    "parse_cgroup_limit",
    "read_cgroup_limit",
    "validate_hz",
]

# ---------------------------------------------------------------------------------------------
# Sampler
# ---------------------------------------------------------------------------------------------

MAX_HZ = 100.0


def validate_hz(hz: float) -> float:
    """Sampling rate in Hz: a finite number in (0, 100]."""
    try:
        value = float(hz)
    except (TypeError, ValueError):
        raise ValueError(f"telemetry rate must be a number of Hz, got {hz!r}") from None
    if not math.isfinite(value) or value <= 0 or value > MAX_HZ:
        raise ValueError(f"telemetry rate must be > 0 and <= {MAX_HZ:g} Hz, got {hz!r}")
    return value


_GROUP_OF = {TorchMemory: "torch", NvmlMemory: "nvml", HostMemory: "host"}
_EMPTY = {"torch": TorchMemory, "nvml": NvmlMemory, "host": HostMemory}


class TelemetrySampler:
    """Samples its sources at `hz` on a daemon thread and publishes `TelemetryEvent`s.

    Ticks follow a fixed schedule (start + k/hz); a read slower than the period skips the
    missed ticks instead of bursting (counted in `overruns`). `clock` and `wait` are
    injectable: `wait(timeout) -> bool` returns True when the sampler should stop.
    """

    def __init__(
        self,
        *sources: Source,
        bus: EventBus,
        hz: float = DEFAULT_HZ,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        self._sources = list(sources)
        self._bus = bus
        self._hz = validate_hz(hz)
        self._clock = clock
        self._stop = threading.Event()
        self._wait = wait if wait is not None else self._stop.wait
        self._read_lock = threading.Lock()
        self._latest: TelemetrySnapshot | None = None
        self._thread: threading.Thread | None = None
        self.samples = 0
        self.overruns = 0

    @property
    def hz(self) -> float:
        return self._hz

    @hz.setter
    def hz(self, value: float) -> None:
        self._hz = validate_hz(value)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def latest(self) -> TelemetrySnapshot | None:
        """The newest snapshot (from the thread or `sample_now`), or None before the first."""
        return self._latest

    def sample_now(self, publish: bool = False) -> TelemetrySnapshot:
        """Read every source synchronously; optionally publish it like a scheduled sample."""
        groups: dict[str, Any] = {}
        with self._read_lock:
            t = self._clock()
            for source in self._sources:
                try:
                    value = source.read()
                except Exception as exc:  # a source broke its never-raise promise
                    name = getattr(source, "group", None)
                    if name in _EMPTY:
                        groups[name] = _EMPTY[name](unavailable=f"source failed: {_reason(exc)}")
                    continue
                name = _GROUP_OF.get(type(value))
                if name is not None:
                    groups[name] = value
            snapshot = TelemetrySnapshot(t=t, **groups)
            self._latest = snapshot
            self.samples += 1
        if publish:
            self._bus.publish(TelemetryEvent(t=snapshot.t, snapshot=snapshot))
        return snapshot

    def start(self) -> None:
        """Start the sampling thread (no-op when already running)."""
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="omni-telemetry", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop and join the thread (idempotent; safe before `start`)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        next_t = self._clock()
        while not self._stop.is_set():
            self.sample_now(publish=True)
            period = 1.0 / self._hz
            next_t += period
            now = self._clock()
            if now > next_t:  # fell behind: skip the missed ticks, keep the phase
                missed = math.floor((now - next_t) / period) + 1
                self.overruns += missed
                next_t += missed * period
            if self._wait(max(0.0, next_t - now)) or self._stop.is_set():
                break

    def close(self) -> None:
        """Stop sampling and close sources that hold resources (NVML)."""
        self.stop()
        for source in self._sources:
            close = getattr(source, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()

