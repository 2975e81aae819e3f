"""EngineWorker: commands in order on one thread, cancel, and a shutdown that never waits past its timeout."""

from __future__ import annotations

import threading
import time

import pytest

from omni_console.engine.engine import Engine, EngineState
from omni_console.engine.worker import EngineWorker
from omni_console.offload.policy import build_policy


class FakeEngine:
    """Just enough engine for the worker: close() records that the release ran and on which thread."""

    def __init__(self) -> None:
        self.closed_on: str | None = None

    def close(self) -> None:
        self.closed_on = threading.current_thread().name


def test_shutdown_times_out_on_a_stuck_command_and_releases_the_loaded_engine_after_it(demo_model_dir):
    engine = Engine(demo_model_dir, device="cpu")
    worker = EngineWorker(engine)
    worker.load(build_policy()).result(timeout=120)
    assert engine.state == EngineState.READY
    entered, release = threading.Event(), threading.Event()
    seen_cancel: list[bool] = []

    def slow(_engine):  # a kernel that ignores cancel: only `release` ends it
        entered.set()
        release.wait(60)
        seen_cancel.append(worker._cancel.is_set())

    stuck = worker.call(slow)
    assert entered.wait(10)
    start = time.monotonic()
    assert worker.shutdown(timeout=0.2) is False
    assert time.monotonic() - start < 0.5
    assert engine.state == EngineState.READY and worker.busy  # not yet: the command still runs
    with pytest.raises(RuntimeError, match="shut down"):
        worker.generate(None)
    release.set()
    stuck.result(timeout=10)
    assert worker.join(timeout=30)
    assert seen_cancel == [True]  # the command in flight was told to cancel
    assert engine.state == EngineState.UNLOADED and engine.placement is None and engine.pipe is None
    assert not worker.busy


def test_shutdown_drops_queued_commands_and_releases_on_the_worker_thread():
    engine = FakeEngine()
    worker = EngineWorker(engine)  # type: ignore[arg-type]
    entered, gate = threading.Event(), threading.Event()
    first = worker.call(lambda _e: entered.set() or gate.wait(10))
    assert entered.wait(10)
    queued = worker.call(lambda _e: pytest.fail("a command queued before shutdown must not run"))
    released = worker.request_shutdown()
    assert worker.request_shutdown() is released  # idempotent
    gate.set()
    assert first.result(timeout=10) is True
    assert released.result(timeout=10) is None
    assert queued.cancelled()
    assert engine.closed_on == "omni-engine"
    assert worker.join(timeout=10)


def test_idle_shutdown_returns_true_at_once_and_commands_run_in_order():
    engine = FakeEngine()
    worker = EngineWorker(engine)  # type: ignore[arg-type]
    order: list[int] = []
    futures = [worker.call(lambda _e, i=i: order.append(i)) for i in range(5)]
    for future in futures:
        future.result(timeout=10)
    assert order == [0, 1, 2, 3, 4]
    start = time.monotonic()
    assert worker.shutdown(timeout=5) is True
    assert time.monotonic() - start < 1.0 and engine.closed_on == "omni-engine"


def test_worker_thread_is_a_daemon_so_exit_never_joins_it():
    worker = EngineWorker(FakeEngine())  # type: ignore[arg-type]
    try:
        assert worker._thread.daemon
    finally:
        worker.shutdown(timeout=5)


def test_a_command_error_reaches_its_future_and_the_worker_keeps_going():
    worker = EngineWorker(FakeEngine())  # type: ignore[arg-type]
    failing = worker.call(lambda _e: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=10)
    assert worker.call(lambda _e: "next").result(timeout=10) == "next"
    assert worker.shutdown(timeout=5)
