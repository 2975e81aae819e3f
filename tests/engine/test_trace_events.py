"""A request's trace from known events: each block's copy and compute on its stream's track, stalls, phases,
steps, expert switches and out-of-memory step-downs; valid against the trace-event format and nested."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trace_format import Complete, Instant, TraceFile, check_nesting

from omni_console.engine.errors import ConfigError
from omni_console.engine.events import (
    BlockTiming,
    ExpertSwitched,
    OomStepDown,
    RequestFinished,
    RequestPhases,
    RequestStarted,
    StagingEvent,
    StepTiming,
    TelemetryEvent,
)
from omni_console.engine.running.trace_events import COMPUTE, COPY, HOST, TraceRecorder, build_trace
from omni_console.engine.running.trace_file import check_trace_place, write_trace
from omni_console.offload.telemetry_types import TelemetrySnapshot, TorchMemory

GB = 1 << 30

T0 = 1000.0  # the request's start on the monotonic clock


def request_events() -> list:
    """One request of two steps over two streamed blocks, its times chosen so every span is known."""
    ev: list = [RequestStarted(t=T0, request_id=7, prompt="p", steps=2, height=64, width=64, seed=1)]
    # step 1: 1.5 → 2.5 (text encoding 1.0 → 1.5); step 2: 2.5 → 3.5; decode 3.5 → 3.8
    for step, begin in ((1, 1.5), (2, 2.5)):
        for k, name in enumerate(("blocks.0", "blocks.1")):
            start = T0 + begin + 0.4 * k
            ev.append(StagingEvent(t=start, target=name, direction="h2d", nbytes=1000, seconds=0.1, start=start))
            ev.append(BlockTiming(t=start + 0.3, target=name, kind="stall", seconds=0.05, start=start + 0.1))
            ev.append(BlockTiming(t=start + 0.3, target=name, kind="compute", seconds=0.2, start=start + 0.15))
        ev.append(StepTiming(t=T0 + begin + 1.0, request_id=7, step=step, total_steps=2, wall_s=1.0, stall_s=0.1,
                             h2d_bytes=2000))
    ev.append(ExpertSwitched(t=T0 + 2.5, request_id=7, from_expert="transformer", to_expert="transformer_2",
                             reason="boundary", timestep=500.0, copied_bytes=10, freed_bytes=10, ring_bytes=0,
                             seconds=0.01))
    ev.append(OomStepDown(t=T0 + 3.0, request_id=7, phase="denoise", component="transformer",
                          action="one block fewer resident"))
    ev.append(RequestPhases(t=T0 + 3.9, request_id=7, frames=1, latent_shape=None,
                            phases={"text_encoding": 0.5, "denoise": 2.0, "vae_decode": 0.3}))
    ev.append(RequestFinished(t=T0 + 4.0, request_id=7, seconds=4.0, ok=True))
    return ev


def spans(trace: dict, tid: int, cat: str) -> list[tuple[str, float, float]]:
    return [(e["name"], e["ts"], e["dur"]) for e in trace["traceEvents"]
            if e["ph"] == "X" and e["tid"] == tid and e.get("cat") == cat]


def test_the_trace_validates_and_names_its_three_tracks():
    trace = build_trace(request_events())
    parsed = TraceFile.model_validate(json.loads(json.dumps(trace)))  # what a viewer reads: the JSON
    check_nesting(parsed)
    names = {e.tid: e.args["name"] for e in parsed.traceEvents if e.ph == "M" and e.name == "thread_name"}
    assert names == {HOST: "host", COPY: "copy stream", COMPUTE: "compute stream"}
    assert all(isinstance(e, Complete | Instant) for e in parsed.traceEvents if e.ph not in "MC")


def test_each_blocks_copy_compute_and_stall_lie_where_they_ran():
    trace = build_trace(request_events())
    us = pytest.approx
    assert spans(trace, COPY, "copy") == [("blocks.0", us(1.5e6), us(1e5)), ("blocks.1", us(1.9e6), us(1e5)),
                                          ("blocks.0", us(2.5e6), us(1e5)), ("blocks.1", us(2.9e6), us(1e5))]
    assert spans(trace, COMPUTE, "compute")[:2] == [("blocks.0", us(1.65e6), us(2e5)),
                                                    ("blocks.1", us(2.05e6), us(2e5))]
    assert spans(trace, COMPUTE, "stall")[0] == ("stall: blocks.0", us(1.6e6), us(5e4))
    copy = next(e for e in trace["traceEvents"] if e.get("cat") == "copy")
    assert copy["args"]["bytes"] == 1000 and copy["args"]["gbps"] == pytest.approx(1000 / 0.1 / 1e9)


def test_phases_and_steps_on_the_host_track():
    trace = build_trace(request_events())
    us = pytest.approx
    assert spans(trace, HOST, "phase") == [("text_encoding", us(1.0e6), us(0.5e6)), ("denoise", us(1.5e6), us(2e6)),
                                           ("vae_decode", us(3.5e6), us(0.3e6))]
    assert spans(trace, HOST, "step") == [("step 1/2", us(1.5e6), us(1e6)), ("step 2/2", us(2.5e6), us(1e6))]
    assert spans(trace, HOST, "request") == [("request 7", 0.0, us(4e6))]
    step = next(e for e in trace["traceEvents"] if e.get("cat") == "step")
    assert step["args"]["stall_s"] == 0.1 and step["args"]["h2d_bytes"] == 2000


def test_expert_switches_and_step_downs_are_instants():
    trace = build_trace(request_events())
    instants = {e["name"]: e for e in trace["traceEvents"] if e["ph"] == "i"}
    switch = instants["expert switch: transformer → transformer_2"]
    assert switch["ts"] == pytest.approx(2.5e6) and switch["s"] == "p" and switch["args"]["reason"] == "boundary"
    oom = instants["out of memory in denoise: one block fewer resident"]
    assert oom["ts"] == pytest.approx(3e6) and oom["s"] == "g"


def test_a_stream_runs_in_order_so_an_overlapping_issue_starts_after_the_last():
    """On CUDA a copy is placed at its issue time; the stream runs one after another, so a copy issued while
    the previous one still ran starts when it ended."""
    ev = [RequestStarted(t=T0, request_id=1, prompt="", steps=1, height=1, width=1, seed=0),
          StagingEvent(t=T0, target="a", direction="h2d", nbytes=1, seconds=0.5, start=T0),
          StagingEvent(t=T0, target="b", direction="h2d", nbytes=1, seconds=0.5, start=T0 + 0.1)]
    assert spans(build_trace(ev), COPY, "copy") == [("a", 0.0, 5e5), ("b", 5e5, 5e5)]


def test_a_new_request_starts_a_new_trace_and_other_events_are_not_kept():
    recorder = TraceRecorder()
    recorder.add_all(request_events())
    recorder.add(RequestStarted(t=T0 + 10, request_id=8, prompt="", steps=1, height=1, width=1, seed=0))
    recorder.add(StagingEvent(t=T0 + 10.5, target="x", direction="h2d", nbytes=1, seconds=0.1, start=T0 + 10.4))
    assert recorder.request_id == 8 and len(recorder.events) == 2
    assert spans(recorder.trace(), COPY, "copy") == [("x", pytest.approx(4e5), pytest.approx(1e5))]


def test_the_trace_file_is_refused_before_work_and_never_replaced_unasked(tmp_path: Path):
    path = tmp_path / "t.json"
    write_trace(path, build_trace(request_events()))
    TraceFile.model_validate_json(path.read_text())
    with pytest.raises(ConfigError, match="exists; pass --overwrite"):
        check_trace_place(path)
    with pytest.raises(FileExistsError):
        write_trace(path, {"traceEvents": []})
    assert json.loads(path.read_text())["traceEvents"]  # the first trace, untouched
    write_trace(path, {"traceEvents": []}, overwrite=True)
    assert json.loads(path.read_text()) == {"traceEvents": []}
    for bad, words in ((tmp_path / "t.txt", "a trace is JSON"), (tmp_path, "is a directory"),
                       (tmp_path / "o.json", "the output's own name")):
        with pytest.raises(ConfigError, match=words):
            check_trace_place(bad, output=tmp_path / "o.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # no temporaries left


@settings(max_examples=200, deadline=None)
@given(origin=st.floats(1.0, 1e6), offsets=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=40),
       seconds=st.lists(st.floats(1e-7, 0.05), min_size=40, max_size=40))
def test_spans_placed_end_to_end_stay_end_to_end_in_the_file(origin: float, offsets: list[float],
                                                             seconds: list[float]):
    """Copies issued back to back on one stream: each starts where the one before ended. Rounded to the file's
    microseconds, none may end past the next one's start (on an H100 one did, by 1 ns, and the viewer's nesting
    rule broke: `single_transformer_blocks.31 ends past its parent`)."""
    ev: list = [RequestStarted(t=origin, request_id=1, prompt="", steps=1, height=1, width=1, seed=0)]
    t = origin
    for k, (gap, s) in enumerate(zip(offsets, seconds, strict=False)):
        t += gap if k % 3 == 0 else 0.0  # runs of copies issued while the one before still ran
        ev.append(StagingEvent(t=t + s, target=f"blocks.{k}", direction="h2d", nbytes=1, seconds=s, start=t))
        ev.append(BlockTiming(t=t + s, target=f"blocks.{k}", kind="compute", seconds=s, start=t))
        t += s
    trace = TraceFile.model_validate(json.loads(json.dumps(build_trace(ev))))
    check_nesting(trace)
    copies = spans(build_trace(ev), COPY, "copy")
    assert all(round(a[1] + a[2], 3) <= b[1] for a, b in zip(copies, copies[1:], strict=False))


def test_a_memory_sample_taken_before_the_request_began_is_not_in_its_trace():
    """The sampler's last reading before the request can arrive after `RequestStarted`; the trace starts at the
    request (no timestamp before 0, which the format forbids)."""
    def sample(t: float) -> TelemetryEvent:
        return TelemetryEvent(t=t, snapshot=TelemetrySnapshot(t=t, torch=TorchMemory(allocated=GB, reserved=2 * GB)))

    recorder = TraceRecorder()
    recorder.add_all([RequestStarted(t=T0, request_id=3, prompt="", steps=1, height=1, width=1, seed=0),
                      sample(T0 - 0.002), sample(T0 + 0.1)])
    trace = recorder.trace()
    TraceFile.model_validate(json.loads(json.dumps(trace)))
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert [c["ts"] for c in counters] == [pytest.approx(1e5)]
