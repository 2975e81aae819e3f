"""The latest request as the console received it: the series its plots draw and the events its trace holds.

No Textual here. The event router hands every event it routes to `RequestRecord.add` (on the UI thread, from
events the console receives anyway, so watching costs the engine nothing); a request that starts starts a new
record. The plot screen reads the series (`memory`, `link`, `stalls`, `marks`), in seconds from the request's
start; the trace key writes `trace()`.

- memory: the console's own telemetry samples (torch's allocated and reserved, NVML's bytes for this process;
  on a CPU the process's RSS, the only memory there is), in GB;
- link: the block and component copies host→device, bytes by when they began, per LINK_BIN_S, in GB/s;
- stalls: each step's exposed stall (compute waiting on copies), in ms, at the step's middle;
- marks: where text encoding, each step and the decode begin (the trace's own spans: engine/running/trace_events).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engine import events
from ..engine.api import TelemetrySnapshot, writes

LINK_BIN_S = 0.5
"""The link's rate is the bytes whose copy began in each such slice of the request, over its length."""
MAX_SAMPLES = 20_000
"""Telemetry samples kept per request (a long request keeps every other one past this: the span stays whole)."""
GB = 1e9


@dataclass(frozen=True, slots=True)
class Series:
    """One plotted line: its legend and its points (x: seconds from the request's start)."""

    label: str
    x: list[float]
    y: list[float]


@dataclass
class RequestRecord:
    """The request running or last run (see the module docstring); `version` counts its changes."""

    started: events.RequestStarted | None = None
    steps: list[events.StepTiming] = field(default_factory=list)
    phases: events.RequestPhases | None = None
    finished: events.RequestFinished | None = None
    samples: list[TelemetrySnapshot] = field(default_factory=list)
    link_bytes: dict[int, int] = field(default_factory=dict)
    trace_events: writes.TraceRecorder = field(default_factory=lambda: writes.TraceRecorder())
    version: int = 0

    @property
    def t0(self) -> float:
        return self.started.t if self.started is not None else 0.0

    def add_all(self, batch: list[events.Event]) -> None:
        for event in batch:
            self.add(event)

    def add(self, event: events.Event) -> None:
        rank = event.rank
        if isinstance(event, events.TelemetryEvent):
            if rank is None and self.started is not None and isinstance(event.snapshot, TelemetrySnapshot):
                self._sample(event.snapshot)
                self.trace_events.add(event)
            return
        if rank not in (None, 0):  # a group's rank 0 speaks for the request
            return
        if isinstance(event, events.RequestStarted):
            self._start(event)
        elif self.started is None:
            return
        elif isinstance(event, events.StagingEvent):
            if event.direction == "h2d":
                start = event.start if event.start is not None else event.t - event.seconds
                if start >= self.t0:
                    slot = int((start - self.t0) / LINK_BIN_S)
                    self.link_bytes[slot] = self.link_bytes.get(slot, 0) + event.nbytes
        elif isinstance(event, events.StepTiming):
            self.steps.append(event)
        elif isinstance(event, events.RequestPhases):
            self.phases = event
        elif isinstance(event, events.RequestFinished):
            self.finished = event
        else:
            self.trace_events.add(event)
            return
        self.trace_events.add(event)
        self.version += 1

    def _start(self, event: events.RequestStarted) -> None:
        self.started, self.steps, self.phases, self.finished = event, [], None, None
        self.samples, self.link_bytes = [], {}
        self.trace_events.add(event)  # starts the trace anew
        self.version += 1

    def _sample(self, snapshot: TelemetrySnapshot) -> None:
        if snapshot.t < self.t0:
            return
        self.samples.append(snapshot)
        if len(self.samples) > MAX_SAMPLES:
            self.samples = self.samples[::2]
        self.version += 1

    # ---- what the plots draw --------------------------------------------------------------------

    def memory(self) -> list[Series]:
        """Device memory over the request (GB): allocated, reserved, NVML's for this process — each that
        the samples carry; with none of them (a CPU) the process's RSS."""
        out = []
        for label, read in (("allocated", lambda s: s.torch.allocated), ("reserved", lambda s: s.torch.reserved),
                            ("NVML process", lambda s: s.nvml.process_used)):
            points = [(s.t - self.t0, read(s) / GB) for s in self.samples if read(s) is not None]
            if points:
                out.append(Series(label, [x for x, _ in points], [y for _, y in points]))
        if not out:
            points = [(s.t - self.t0, s.host.rss / GB) for s in self.samples if s.host.rss is not None]
            if points:
                out.append(Series("host RSS", [x for x, _ in points], [y for _, y in points]))
        return out

    def link(self) -> Series:
        """Host→device GB/s per LINK_BIN_S (slices with no copy are 0), at each slice's start."""
        if not self.link_bytes:
            return Series("link GB/s", [], [])
        slots = range(max(self.link_bytes) + 1)
        return Series("link GB/s", [k * LINK_BIN_S for k in slots],
                      [self.link_bytes.get(k, 0) / LINK_BIN_S / GB for k in slots])

    def stalls(self) -> Series:
        """Each step's exposed stall (ms), at the step's middle."""
        return Series("stall ms/step", [s.t - s.wall_s / 2 - self.t0 for s in self.steps],
                      [s.stall_s * 1000 for s in self.steps])

    def marks(self) -> list[tuple[float, str]]:
        """(seconds, name) where each phase and each step begins, and where the request ended."""
        if self.started is None:
            return []
        spans = [self.started, *self.steps, *([self.phases] if self.phases is not None else [])]
        phases, steps = writes.request_spans(spans)
        out = [(p.start - self.t0, p.name) for p in phases if p.name != "denoise"]
        out += [(span.start - self.t0, span.name) for span, _ in steps]
        if self.finished is not None:
            out.append((self.finished.t - self.t0, "end"))
        return sorted(out)

    def trace(self) -> dict:
        return self.trace_events.trace()
