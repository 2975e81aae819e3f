"""The console's view of several GPUs: `GroupEngine` drives two gloo ranks like one engine — the
same images as the single-process engine for each seed, every event tagged with its rank (each rank's
own telemetry too), and a cancel, a dead rank or a close stops every rank process without hanging."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_engine import request_for

from omni_console.engine.engine import Engine, EngineState
from omni_console.engine.events import StepTiming
from omni_console.engine.loading.loader import LoadCancelled
from omni_console.engine.ranks.group_engine import GroupEngine
from omni_console.engine.ranks.rank_group import RankFailed
from omni_console.engine.ranks.rank_layout import RankLayout
from omni_console.offload.events import EventBus, LogEvent, StagingEvent, TelemetryEvent
from omni_console.offload.policy import build_policy

pytestmark = pytest.mark.slow  # end to end (spawns rank processes): .ci/run runs it, `pytest -q` skips it

POLICY = build_policy({"text_encoder": False, "text_encoder_2": True, "vae": False}, 1)


def _procs_gone(engine: GroupEngine, procs: list) -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if engine.group is None and all(not p.is_alive() for p in procs):
            return True
        time.sleep(0.1)
    return False


def test_two_ranks_serve_the_model_like_one_engine(demo_model_dir: Path) -> None:
    single = Engine(demo_model_dir, device="cpu")
    single.load(POLICY)
    expected = [np.asarray(single.generate(request_for("flux", seed)).image) for seed in (7, 8)]
    single.close()

    bus = EventBus()
    events = bus.subscribe()
    engine = GroupEngine(demo_model_dir, RankLayout(2, True), device_kind="cpu", bus=bus, telemetry_hz=20.0)
    assert engine.world == 2 and engine.state == EngineState.DISCOVERED
    report = engine.load(POLICY)
    procs = list(engine.group._procs)
    assert engine.state == EngineState.READY and 0 < report.block_host_bytes < report.streamed_bytes  # its half
    assert 0 < report.milestones["ranks_started"] < report.milestones["dits_placed"] <= report.seconds  # started here
    result = engine.generate(request_for("flux", 7))
    assert np.array_equal(np.asarray(result.image), expected[0])
    assert len(result.rank_results) == 1 and np.array_equal(np.asarray(result.rank_results[0].image), expected[1])
    # and every rank's own figures, by rank (what `run --gpus` reports rank by rank)
    assert [np.asarray(r.image).tolist() for r in result.ranks] == [e.tolist() for e in expected]
    assert result.ranks[0].seconds == result.seconds and all(len(r.steps) == len(result.steps) for r in result.ranks)
    assert len(report.ranks) == 2 and report.pinned_bytes == sum(r.pinned_bytes for r in report.ranks)
    assert all(0 < r.block_host_bytes < r.streamed_bytes for r in report.ranks)
    assert all(r.seconds < report.seconds and "ranks_started" not in r.milestones for r in report.ranks)
    seen = events.drain()  # a command's events are on the bus when it returns
    for kind in (StagingEvent, StepTiming):
        assert {e.rank for e in seen if isinstance(e, kind)} >= {0, 1}, kind.__name__
    deadline = time.monotonic() + 10  # and each rank's telemetry keeps coming between commands
    idle: set[int | None] = set()
    while idle < {0, 1} and time.monotonic() < deadline:
        time.sleep(0.1)
        idle |= {e.rank for e in events.drain() if isinstance(e, TelemetryEvent)}
    assert idle >= {0, 1}
    engine.unload()
    assert engine.state == EngineState.UNLOADED and _procs_gone(engine, procs)
    engine.close()


def test_ranks_started_ahead_are_the_ones_that_load(demo_model_dir: Path) -> None:
    """`prepare` (the console calls it when the model opens) starts the ranks and imports the model's
    classes in each; the load then only reads, on those same processes."""
    bus = EventBus()
    events = bus.subscribe()
    engine = GroupEngine(demo_model_dir, RankLayout(2, True), device_kind="cpu", bus=bus, telemetry_hz=None)
    try:
        assert engine.prepare() > 0 and engine.prepare() == 0.0  # once
        procs = list(engine.group._procs)
        assert engine.state == EngineState.DISCOVERED and all(p.is_alive() for p in procs)
        assert any("2 ranks started" in e.message for e in events.drain() if isinstance(e, LogEvent))
        report = engine.load(POLICY)
        assert engine.group._procs == procs and engine.state == EngineState.READY
        assert "ranks_started" not in report.milestones and "classes_imported" not in report.milestones
    finally:
        engine.close()
    assert _procs_gone(engine, procs)


def test_a_start_ahead_that_is_cancelled_is_one_line_and_leaves_no_rank(demo_model_dir: Path) -> None:
    import multiprocessing

    bus = EventBus()
    events = bus.subscribe()
    engine = GroupEngine(demo_model_dir, RankLayout(2, True), device_kind="cpu", bus=bus, telemetry_hz=None)
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()  # the operator quits while the ranks start
    engine.prepare(cancel)
    assert engine.group is None and engine.state == EngineState.DISCOVERED
    lines = [e.message for e in events.drain() if isinstance(e, LogEvent) and e.level == "warning"]
    assert lines == ["ranks not started ahead of the load: start cancelled: every rank stopped"]
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("omni-rank")]
    engine.close()


def test_cancel_during_a_request_stops_every_rank(demo_model_dir: Path) -> None:
    engine = GroupEngine(demo_model_dir, RankLayout(2, True), device_kind="cpu", telemetry_hz=None)
    engine.load(POLICY)
    procs = list(engine.group._procs)
    cancel = threading.Event()
    started = engine.bus.subscribe()

    def cancel_at_first_step() -> None:
        while not any(isinstance(e, StepTiming) for e in started.drain()):
            time.sleep(0.01)
        cancel.set()

    threading.Thread(target=cancel_at_first_step, daemon=True).start()
    from dataclasses import replace

    with pytest.raises(RankFailed, match="request cancelled: every rank stopped"):
        engine.generate(replace(request_for("flux", 7), steps=200), cancel=cancel)
    assert engine.state == EngineState.FAILED and _procs_gone(engine, procs)
    engine.load(POLICY)  # and it loads again
    assert engine.state == EngineState.READY
    engine.close()
    assert engine.state == EngineState.UNLOADED and engine.group is None


def test_cancel_during_the_load_is_a_cancelled_load(demo_model_dir: Path) -> None:
    engine = GroupEngine(demo_model_dir, RankLayout(2, False), device_kind="cpu", telemetry_hz=None)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LoadCancelled):
        engine.load(POLICY, cancel=cancel)
    assert engine.state == EngineState.FAILED and engine.failure == "load cancelled" and engine.group is None


def test_a_rank_that_dies_fails_the_next_request_with_one_line(demo_model_dir: Path) -> None:
    engine = GroupEngine(demo_model_dir, RankLayout(2, True), device_kind="cpu", telemetry_hz=None)
    engine.load(POLICY)
    procs = list(engine.group._procs)
    procs[1].kill()
    started = time.monotonic()
    with pytest.raises(RankFailed, match="rank 1 exited"):
        engine.generate(request_for("flux", 7))
    assert time.monotonic() - started < 60
    assert engine.state == EngineState.FAILED and "rank 1 exited" in engine.failure and _procs_gone(engine, procs)
    engine.close()


def test_a_bad_model_dir_fails_before_any_rank_starts(tmp_path: Path) -> None:
    from omni_console.engine.errors import ConfigError

    with pytest.raises(ConfigError):
        GroupEngine(tmp_path / "missing", RankLayout(2, True), device_kind="cpu")
