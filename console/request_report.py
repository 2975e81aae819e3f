"""The console's run report of a served request: the engine's one builder (`run_report`), fed as `run` feeds it.

So the TUI and `run` report one request the same way (the history keeps it; a test compares the JSON).
No Textual here. The event totals come from the reporter's own bus subscription, folded into bounded
`RunTotals` on the UI's drain ticks (so an idle console holds no backlog) and at report time on the
engine thread; each report covers the events since the previous one (the first: since the console
opened, the load included, as `run`'s covers its load). The device memory is sampled from the previous
report to this one (`RunMemory`: NVML's per-process peak on a GPU; nothing to measure on a CPU).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..engine.api import probes, service
from .telemetry_text import describe_snapshot

if TYPE_CHECKING:
    from ..engine.api import EngineHandle, service


class RequestReporter:
    """Builds each finished request's report on the engine thread (`build`); `fold` on the UI thread."""

    def __init__(self, engine: EngineHandle, sample: Callable[[], Any]) -> None:
        """`sample`: the newest telemetry snapshot read now (the report's `final` lines)."""
        self.engine = engine
        self.sample = sample
        self.sub = engine.bus.subscribe()
        self.load: service.LoadReport | None = None  # the load the requests run on (set when it succeeds)
        self._totals = service.RunTotals()
        self._memory: probes.RunMemory | None = None
        self._lock = threading.Lock()

    def fold(self) -> None:
        """Take the queued events into the totals (bounded memory however long the console idles)."""
        with self._lock:
            self._totals.add_all(self.sub.drain())

    def load_done(self, future: Future) -> None:
        """A load command ended (engine thread): after a load, the requests' device memory is sampled."""
        if future.cancelled() or future.exception() is not None:
            return
        self.load = future.result()
        self._restart_memory()

    def _restart_memory(self) -> None:
        self._stop_memory()
        engine = self.engine
        self._memory = probes.RunMemory.start(engine.device, engine.device_name, None, None)

    def _stop_memory(self) -> None:
        """End the previous sampling (a meter's thread and NVML handle) if `finish` did not."""
        memory, self._memory = self._memory, None
        if memory is not None and memory.meter is not None and memory.source is not None:
            with contextlib.suppress(Exception):  # already stopped by `finish`
                memory.meter.stop()
                memory.source.close()

    def build(self, ticket: service.Ticket, outcome: service.Outcome) -> dict[str, Any] | None:
        """The report of a request that ran and was written (engine thread; None without a load or a result)."""
        result = outcome.result
        if result is None or self.load is None:
            return None
        with self._lock:
            self._totals.add_all(self.sub.drain())
            totals, self._totals = self._totals, service.RunTotals()
        memory, self._memory = self._memory, None  # finished here
        measured = memory.finish(result.peak_allocated_bytes, result.peak_reserved_bytes) if memory else {}
        predicted = memory.predicted(result.check, measured.get("process_peak_bytes")) if memory else {}
        self._restart_memory()
        return service.served_report(self.engine, ticket, outcome, load=self.load, memory={**measured, **predicted},
                             totals=totals.summary(), events_dropped=self.sub.dropped,
                             telemetry={**totals.telemetry_peaks(), "final": describe_snapshot(self.sample())})

    def close(self) -> None:
        self._stop_memory()
        self.sub.close()
