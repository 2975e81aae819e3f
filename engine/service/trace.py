"""A request's trace, recorded from the engine's bus while it runs and written when asked (`run --trace`).

The recorder keeps the events a trace draws (engine/running/trace_events.py) on a subscription of its own,
large enough for a long request, so it never competes with the progress lines for queue room."""

from __future__ import annotations

from pathlib import Path

from ...offload.events import EventBus
from ..running.trace_events import LIMIT, TraceRecorder
from ..running.trace_file import write_trace


class TraceCapture:
    """Subscribes to `bus` now; `write` builds the latest request's trace from what it received."""

    def __init__(self, bus: EventBus) -> None:
        self._sub = bus.subscribe(maxlen=LIMIT)
        self.recorder = TraceRecorder()

    def drain(self) -> TraceRecorder:
        self.recorder.add_all(self._sub.drain())
        self.recorder.dropped += self._sub.dropped
        return self.recorder

    def write(self, path: Path, *, overwrite: bool = False) -> str:
        """Write the trace at `path` (atomically; FileExistsError if it exists and not `overwrite`) and stop
        listening; returns the line that says so."""
        recorder = self.drain()
        self.close()
        trace = recorder.trace()
        size = write_trace(path, trace, overwrite=overwrite)
        return f"trace: {path} ({len(trace['traceEvents'])} trace events, {size / 1e6:.1f} MB)"

    def close(self) -> None:
        self._sub.close()
