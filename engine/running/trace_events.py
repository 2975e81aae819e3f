"""A request's Chrome/Perfetto trace, built from the typed events the engine already publishes.

The trace-event format's JSON object form (`{"traceEvents": [...]}`, timestamps in microseconds): one
process, three tracks (threads): the host (the request, its phases and steps, expert switches), the copy
stream (each block's copy) and the compute stream (each streamed block's forward and the waits for its
copy). Out-of-memory step-downs and retries are global instant events; device memory and the link's
rate are counter tracks. It opens in Perfetto's UI and in chrome://tracing.

Where the times come from: every event's `t` is the monotonic clock; a block's copy or compute carries
when it began (CPU) or was issued (CUDA). A stream runs its work in order, so on a stream's track each
span starts at its issue time or when the one before it ended, whichever is later. Phases are placed
from the step clock's boundaries: text encoding ends where the first step begins, the decode begins
where the last step ended. No torch here: the console builds traces from events it has received.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..events import (
    BlocksSkipped,
    BlockTiming,
    Event,
    ExpertSwitched,
    OomRetry,
    OomStepDown,
    RequestFinished,
    RequestPhases,
    RequestStarted,
    StagingEvent,
    StepTiming,
    TelemetryEvent,
)

PID = 1
HOST, COPY, COMPUTE = 1, 2, 3
TRACKS = {HOST: "host", COPY: "copy stream", COMPUTE: "compute stream"}
KEPT = (RequestStarted, RequestFinished, RequestPhases, StepTiming, StagingEvent, BlockTiming, BlocksSkipped,
        ExpertSwitched, OomStepDown, OomRetry, TelemetryEvent)
"""The events a trace draws; a recorder keeps these and nothing else."""
LIMIT = 2_000_000
"""Events one recorder keeps at most (a long video request on a small budget: ~10^5 block copies)."""


@dataclass
class TraceRecorder:
    """The events of the latest request, from its `RequestStarted` on (a new request starts a new trace)."""

    events: list[Event] = field(default_factory=list)
    dropped: int = 0  # events past LIMIT, not kept

    def add(self, event: Event) -> None:
        if isinstance(event, RequestStarted):
            self.events, self.dropped = [event], 0
        elif self.events and isinstance(event, KEPT):
            if len(self.events) < LIMIT:
                self.events.append(event)
            else:
                self.dropped += 1

    def add_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.add(event)

    @property
    def request_id(self) -> int | None:
        return self.events[0].request_id if self.events else None  # type: ignore[attr-defined]

    def trace(self) -> dict[str, Any]:
        return build_trace(self.events, dropped=self.dropped)


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


class _Builder:
    def __init__(self, origin: float) -> None:
        self.origin = origin
        self.out: list[dict[str, Any]] = []

    def ts(self, t: float) -> float:
        return _us(t - self.origin)

    def span(self, tid: int, name: str, cat: str, start: float, seconds: float, **args: Any) -> None:
        """`ts` and the end are each rounded from the clock, `dur` is their difference: spans placed end to end
        stay end to end (a `dur` rounded on its own could end 1 ns past the next span's start, which viewers
        read as a span inside the one before it that ends past its parent)."""
        ts = self.ts(start)
        end = max(self.ts(start + max(seconds, 0.0)), ts)
        self.out.append({"name": name, "cat": cat, "ph": "X", "pid": PID, "tid": tid, "ts": ts,
                         "dur": round(end - ts, 3), "args": args})

    def instant(self, tid: int, name: str, cat: str, t: float, scope: str = "t", **args: Any) -> None:
        self.out.append({"name": name, "cat": cat, "ph": "i", "s": scope, "pid": PID, "tid": tid, "ts": self.ts(t),
                         "args": args})

    def counter(self, name: str, t: float, **values: float) -> None:
        self.out.append({"name": name, "cat": "counter", "ph": "C", "pid": PID, "tid": HOST, "ts": self.ts(t),
                         "args": values})


def _metadata(request_id: int | None) -> list[dict[str, Any]]:
    title = f"omni-console request {request_id}" if request_id is not None else "omni-console"
    rows: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": PID, "tid": HOST, "ts": 0,
                                   "args": {"name": title}}]
    for tid, name in TRACKS.items():
        rows.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "ts": 0, "args": {"name": name}})
        rows.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid, "ts": 0,
                     "args": {"sort_index": tid}})
    return rows


def _in_order(spans: list[tuple[float, float, Event]]) -> list[tuple[float, float, Event]]:
    """(start, seconds, event) of one stream, each starting no earlier than the one before it ended."""
    placed, free = [], float("-inf")
    for start, seconds, event in sorted(spans, key=lambda s: s[0]):
        begin = max(start, free)
        placed.append((begin, seconds, event))
        free = begin + seconds
    return placed


def _streams(b: _Builder, events: list[Event]) -> None:
    copies: list[tuple[float, float, Event]] = []
    compute: list[tuple[float, float, Event]] = []
    for e in events:
        if isinstance(e, StagingEvent):
            copies.append((e.start if e.start is not None else e.t - e.seconds, e.seconds, e))
        elif isinstance(e, BlockTiming):
            compute.append((e.start, e.seconds, e))
    # a copy issued before the request began (the previous request's read-ahead) is not this request's
    copies = [c for c in copies if c[0] >= b.origin]
    compute = [c for c in compute if c[0] >= b.origin]
    for start, seconds, e in _in_order(copies):
        assert isinstance(e, StagingEvent)
        b.span(COPY, e.target, "copy", start, seconds, bytes=e.nbytes, direction=e.direction, tier=e.tier,
               sync=e.sync, gbps=float(f"{e.gbps:.4g}"))
    for start, seconds, e in _in_order(compute):
        assert isinstance(e, BlockTiming)
        if e.kind == "stall":
            b.span(COMPUTE, f"stall: {e.target}", "stall", start, seconds, block=e.target)
        else:
            b.span(COMPUTE, e.target, "compute", start, seconds)


@dataclass(frozen=True, slots=True)
class Span:
    """One host-track span: `start`/`end` monotonic seconds."""

    name: str
    start: float
    end: float


def request_spans(events: Iterable[Event]) -> tuple[list[Span], list[tuple[Span, StepTiming]]]:
    """The request's phases (text_encoding, denoise, vae_decode, each that ran) and its steps, placed on the
    monotonic clock from the step clock's boundaries (see the module docstring); steps lie inside denoise.
    The console's plot marks the same spans."""
    started = next((e for e in events if isinstance(e, RequestStarted)), None)
    steps = [e for e in events if isinstance(e, StepTiming)]
    phases = next((e for e in events if isinstance(e, RequestPhases)), None)
    seconds = dict(phases.phases) if phases is not None else {}
    out: list[Span] = []
    placed: list[tuple[Span, StepTiming]] = []
    if steps:
        first, last = steps[0].t - steps[0].wall_s, steps[-1].t
        denoise_end = first + seconds.get("denoise", last - first)
        text = seconds.get("text_encoding")
        text_start = first - text if text is not None else (started.t if started is not None else first)
        if text_start < first:
            out.append(Span("text_encoding", text_start, first))
        out.append(Span("denoise", first, max(denoise_end, first)))
        for s in steps:
            start = min(max(s.t - s.wall_s, first), denoise_end)
            placed.append((Span(f"step {s.step}/{s.total_steps}", start, min(max(s.t, start), denoise_end)), s))
        decode_start = max(last, denoise_end)  # the two clocks differ by microseconds: no overlap
    else:
        decode_start = started.t if started is not None else 0.0
    if "vae_decode" in seconds:
        out.append(Span("vae_decode", decode_start, decode_start + seconds["vae_decode"]))
    return out, placed


def _host(b: _Builder, events: list[Event]) -> None:
    started = next((e for e in events if isinstance(e, RequestStarted)), None)
    finished = next((e for e in events if isinstance(e, RequestFinished)), None)
    phases, steps = request_spans(events)
    if started is not None:
        end = finished.t if finished is not None else max([started.t, *(p.end for p in phases)])
        end = max(end, *(p.end for p in phases)) if phases else end
        b.span(HOST, f"request {started.request_id}", "request", started.t, end - started.t,
               prompt=started.prompt, steps=started.steps, height=started.height, width=started.width,
               seed=started.seed, ok=finished.ok if finished is not None else None,
               error=finished.error if finished is not None else "")
    for p in phases:
        b.span(HOST, p.name, "phase", p.start, p.end - p.start)
    for span, s in steps:
        b.span(HOST, span.name, "step", span.start, span.end - span.start, stall_s=s.stall_s, h2d_bytes=s.h2d_bytes,
               sync_fetches=s.sync_fetches, cache_hits=s.cache_hits, skipped_blocks=s.skipped_blocks)
    for e in events:
        if isinstance(e, ExpertSwitched):
            b.instant(HOST, f"expert switch: {e.from_expert} → {e.to_expert}", "expert", e.t, "p", reason=e.reason,
                      seconds=e.seconds, copied_bytes=e.copied_bytes, freed_bytes=e.freed_bytes,
                      prefetched_bytes=e.prefetched_bytes)
        elif isinstance(e, OomStepDown):
            b.instant(HOST, f"out of memory in {e.phase}: {e.action}", "oom", e.t, "g", component=e.component,
                      message=e.message)
        elif isinstance(e, OomRetry):
            b.instant(HOST, f"out of memory staging {e.component}: retried", "oom", e.t, "g", bytes=e.nbytes,
                      message=e.message)
        elif isinstance(e, BlocksSkipped):
            b.instant(COMPUTE, f"cache skipped {e.blocks} blocks", "cache", e.t, first=e.first, last=e.last,
                      bytes=e.nbytes)


def _counters(b: _Builder, events: list[Event]) -> None:
    for e in events:  # a sample taken before the request began (published after it) is not this request's
        if isinstance(e, TelemetryEvent) and e.t >= b.origin:
            snap: Any = e.snapshot
            memory = {k: v for k, v in (("allocated", snap.torch.allocated), ("reserved", snap.torch.reserved),
                                         ("nvml_process", snap.nvml.process_used)) if v is not None}
            if memory:
                b.counter("device memory (bytes)", e.t, **memory)
            if snap.nvml.pcie_rx_bytes_per_s is not None:
                b.counter("PCIe rx (bytes/s)", e.t, rx=snap.nvml.pcie_rx_bytes_per_s)


def build_trace(events: Iterable[Event], dropped: int = 0) -> dict[str, Any]:
    """The trace of the request whose events these are (the object form of the trace-event format)."""
    events = list(events)
    started = next((e for e in events if isinstance(e, RequestStarted)), None)
    origin = started.t if started is not None else min((e.t for e in events), default=0.0)
    b = _Builder(origin)
    _host(b, events)
    _streams(b, events)
    _counters(b, events)
    body = sorted(b.out, key=lambda row: row["ts"])
    return {
        "traceEvents": _metadata(started.request_id if started is not None else None) + body,
        "displayTimeUnit": "ms",
        "otherData": {"producer": "omni-console", "clock": "monotonic, from the request's start",
                      "events_dropped": dropped},
    }
