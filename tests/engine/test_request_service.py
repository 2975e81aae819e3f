"""The request service: a FIFO queue run one at a time on the engine's worker, outputs written, outcomes
kept in a bounded history, every change an event. Fast tests drive it over a stand-in engine whose
requests wait for the test; the slow one serves the demo model and compares with the engine's own image."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from omni_console.engine.errors import ConfigError
from omni_console.engine.events import EventBus
from omni_console.engine.running.outputs import check_output
from omni_console.engine.running.runner import GenerateRequest
from omni_console.engine.service.checks import CheckedRun
from omni_console.engine.service.events import (
    HistoryNote,
    QueueReordered,
    RequestCancelled,
    RequestDone,
    RequestFailed,
    RequestQueued,
    RequestRunning,
)
from omni_console.engine.service.history import History
from omni_console.engine.service.queue import RequestQueue
from omni_console.engine.service.service import RequestService, request_of


class GatedEngine:
    """Stands in for an engine: each request waits until the test opens its gate (or it is cancelled)."""

    def __init__(self, tmp_path: Path) -> None:
        self.bus = EventBus()
        self.model = SimpleNamespace(path=tmp_path / "model")
        self.plan = None
        self.ran: list[str] = []
        self.gates: dict[str, threading.Event] = {}
        self.started = threading.Event()
        self.closed = 0

    def gate(self, prompt: str) -> threading.Event:
        return self.gates.setdefault(prompt, threading.Event())

    def generate(self, request: GenerateRequest, cancel: threading.Event | None = None):
        self.ran.append(request.prompt)
        self.started.set()
        while not self.gate(request.prompt).wait(0.01):
            if cancel is not None and cancel.is_set():
                return SimpleNamespace(cancelled=True, seconds=0.0, steps=[], peak_allocated_bytes=None)
        if request.prompt == "boom":
            raise RuntimeError("the device fell over\nsecond line")
        image = Image.new("RGB", (8, 8), (len(request.prompt), 0, 0))
        return SimpleNamespace(cancelled=False, image=image, frames=[], is_video=False, fps=None, audio=None,
                               seconds=0.5, steps=[SimpleNamespace(wall_s=0.25)], peak_allocated_bytes=1000)

    def close(self) -> None:
        self.closed += 1


def checked(tmp_path: Path, prompt: str) -> CheckedRun:
    target = check_output(tmp_path / f"{prompt}.png", video=False, frames=1)
    return CheckedRun(GenerateRequest(prompt=prompt, steps=2, seed=7), target, False)


def events_of(sub, kinds) -> list:
    return [e for e in sub.drain() if isinstance(e, kinds)]


def test_three_requests_run_in_order_one_at_a_time_and_the_second_cancelled_never_runs(tmp_path):
    engine = GatedEngine(tmp_path)
    sub = engine.bus.subscribe()
    service = RequestService(engine, history=History(tmp_path / "cache" / "history.json"))
    first, second, third = (service.submit(checked(tmp_path, p)) for p in ("one", "two", "three"))
    assert engine.started.wait(5)
    assert [t.number for t in service.waiting()] == [second.number, third.number]
    assert service.running is first and engine.ran == ["one"]  # the others wait: one at a time
    assert service.cancel(second.number)
    engine.gate("one").set()
    engine.gate("three").set()
    assert third.future.result(5).state == "done"
    assert first.future.result(0).state == "done" and second.future.result(0).state == "cancelled"
    assert engine.ran == ["one", "three"]
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["one.png", "three.png"]
    kinds = (RequestQueued, RequestRunning, RequestDone, RequestCancelled)
    seen = [(type(e).__name__, e.ticket) for e in events_of(sub, kinds)]
    # the first request starts on the worker while the others are being queued: its start may come anywhere after
    # its own queueing; everything from the cancel on is in one order
    head, tail = seen[:4], seen[4:]
    assert [t for kind, t in head if kind == "RequestQueued"] == [1, 2, 3]
    assert head.index(("RequestRunning", 1)) > head.index(("RequestQueued", 1))
    assert tail == [("RequestCancelled", 2), ("RequestDone", 1), ("RequestRunning", 3), ("RequestDone", 3)]
    assert [e.status for e in service.history.entries] == ["done", "done"]  # a request that never ran is not kept
    service.close()


def test_reordering_runs_the_moved_request_next(tmp_path):
    engine = GatedEngine(tmp_path)
    sub = engine.bus.subscribe()
    service = RequestService(engine)
    tickets = [service.submit(checked(tmp_path, p)) for p in ("aa", "bb", "cc", "dd")]
    assert engine.started.wait(5)
    assert service.move(tickets[3].number, 0)
    assert not service.move(tickets[0].number, 1)  # running: not in the queue
    assert events_of(sub, QueueReordered)[-1].tickets == (4, 2, 3)
    for gate in ("aa", "bb", "cc", "dd"):
        engine.gate(gate).set()
    tickets[2].future.result(5)
    assert engine.ran == ["aa", "dd", "bb", "cc"]
    service.close()


def test_cancelling_the_running_request_stops_it_and_the_next_one_runs(tmp_path):
    engine = GatedEngine(tmp_path)
    service = RequestService(engine)
    first, second = service.submit(checked(tmp_path, "one")), service.submit(checked(tmp_path, "two"))
    assert engine.started.wait(5)
    assert service.cancel(first.number)
    assert first.future.result(5).state == "cancelled"
    engine.gate("two").set()
    assert second.future.result(5).state == "done"
    assert not (tmp_path / "one.png").exists() and (tmp_path / "two.png").exists()
    assert service.clear() == 0
    service.close()
    assert service.worker.join(5) and engine.closed == 0  # its own worker ends; the engine is its owner's to close
    with pytest.raises(RuntimeError, match="closed"):
        service.submit(checked(tmp_path, "late"))


def test_a_failed_request_is_one_line_and_the_queue_goes_on(tmp_path):
    engine = GatedEngine(tmp_path)
    sub = engine.bus.subscribe()
    service = RequestService(engine)
    bad, good = service.submit(checked(tmp_path, "boom")), service.submit(checked(tmp_path, "fine"))
    engine.gate("boom").set()
    engine.gate("fine").set()
    assert good.future.result(5).state == "done"
    outcome = bad.future.result(0)
    assert (outcome.state, outcome.error) == ("failed", "RuntimeError: the device fell over")
    assert [e.error for e in events_of(sub, RequestFailed)] == ["generation failed: RuntimeError: the device fell over"]
    service.close()


@pytest.mark.slow  # builds the demo model
def test_a_request_the_model_cannot_run_is_refused_before_it_is_queued(tmp_path, demo_model_dir):
    from omni_console.engine.engine import Engine

    engine = Engine(demo_model_dir, device="cpu")
    sub = engine.bus.subscribe()
    service = RequestService(engine)
    with pytest.raises(ConfigError, match="--steps 0: must be at least 1"):
        service.submit(GenerateRequest(prompt="x", steps=0), tmp_path / "x.png")
    with pytest.raises(ConfigError, match="--output"):
        service.submit(GenerateRequest(prompt="x", steps=1), tmp_path / "x.txt")
    assert service.waiting() == [] and sub.drain() == [] and engine.state.value == "discovered"
    service.close()


# ---------------------------------------------------------------- history


def test_the_history_survives_a_restart_and_resubmits_with_its_settings(tmp_path):
    path = tmp_path / "cache" / "history.json"
    engine = GatedEngine(tmp_path)
    service = RequestService(engine, history=History(path), report=lambda t, o: {"request_seconds": 0.5})
    engine.gate("again").set()
    service.submit(checked(tmp_path, "again")).future.result(5)
    service.close()
    entry = History(path).entries[-1]  # a new process reads it back
    assert (entry.status, entry.request.prompt, entry.request.seed, entry.step_s, entry.peak_bytes) == \
        ("done", "again", 7, 0.25, 1000)
    assert entry.files == [str(tmp_path / "again.png")] and entry.report == {"request_seconds": 0.5}
    assert request_of(entry) == GenerateRequest(prompt="again", steps=2, seed=7)


INVALID = b'{"schema": "omni-console.history/1", "entries": [{"ticket": 0}]}'


@pytest.mark.parametrize("content", [b"{not json", INVALID, b"[" * 100_000, b" " * (2 * 2**10 + 1)],
                         ids=["corrupt", "invalid", "deep", "huge"])
def test_a_corrupt_or_huge_history_is_ignored_with_one_note(tmp_path, content):
    path = tmp_path / "history.json"
    path.write_bytes(content)
    history = History(path, max_bytes=2 * 2**10 if content.startswith(b" ") else 8 * 2**20)
    assert history.entries == []
    assert history.note is not None and history.note.startswith(f"history {path} ignored: ")
    engine = GatedEngine(tmp_path)
    sub = engine.bus.subscribe()
    service = RequestService(engine, history=history)
    assert [e.message for e in events_of(sub, HistoryNote)] == [history.note]  # said once
    service.close()


def test_a_symlinked_history_is_never_followed(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text('{"schema": "omni-console.history/1", "entries": []}')
    (tmp_path / "history.json").symlink_to(target)
    history = History(tmp_path / "history.json")
    assert history.note is not None and "symbolic link" in history.note


def test_the_history_is_pruned_oldest_first(tmp_path):
    engine = GatedEngine(tmp_path)
    service = RequestService(engine, history=History(tmp_path / "h.json", max_entries=3))
    for prompt in ("p1", "p2", "p3", "p4", "p5"):
        engine.gate(prompt).set()
        service.submit(checked(tmp_path, prompt)).future.result(5)
    assert [e.request.prompt for e in History(tmp_path / "h.json", max_entries=3).entries] == ["p3", "p4", "p5"]
    service.close()
    small = History(tmp_path / "s.json", max_bytes=1500)
    service = RequestService(engine, history=small, report=lambda t, o: {"pad": "x" * 500})
    for prompt in ("q1", "q2", "q3"):
        engine.gate(prompt).set()
        service.submit(checked(tmp_path, prompt)).future.result(5)
    kept = [e.request.prompt for e in History(tmp_path / "s.json", max_bytes=1500).entries]
    assert kept and kept[-1] == "q3" and "q1" not in kept and (tmp_path / "s.json").stat().st_size <= 1500
    service.close()


# ---------------------------------------------------------------- the queue itself


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["push", "pop", "remove", "move", "clear"]), st.integers(0, 8),
                          st.integers(-2, 9)), max_size=40))
def test_the_queue_keeps_fifo_order_under_any_edits(ops):
    queue: RequestQueue[int] = RequestQueue(lambda n: n)
    model: list[int] = []
    number = 0
    for op, ticket, position in ops:
        if op == "push":
            number += 1
            assert queue.push(number) == len(model)
            model.append(number)
        elif op == "pop":
            assert queue.pop() == (model.pop(0) if model else None)
        elif op == "remove":
            assert queue.remove(ticket) == (model.pop(model.index(ticket)) if ticket in model else None)
        elif op == "move":
            moved = ticket in model
            assert queue.move(ticket, position) == moved
            if moved:
                model.remove(ticket)
                model.insert(max(0, min(position, len(model))), ticket)
        else:
            assert queue.clear() == model
            model = []
        assert queue.tickets() == tuple(model)


# ---------------------------------------------------------------- a real model


@pytest.mark.slow
def test_the_service_serves_the_demo_model_as_the_engine_does(tmp_path, demo_model_dir):
    from omni_console.engine.engine import Engine
    from omni_console.offload.policy import build_policy

    request = GenerateRequest(prompt="a red fox", steps=1, height=64, width=64, seed=3, guidance=3.5)
    engine = Engine(demo_model_dir, device="cpu")
    engine.load(build_policy({}, 2))
    expected = np.asarray(engine.generate(request).image)
    service = RequestService(engine)
    outcome = service.submit(request, tmp_path / "fox.png").future.result(120)
    assert outcome.state == "done" and outcome.written.files == [tmp_path / "fox.png"]
    assert np.array_equal(np.asarray(Image.open(tmp_path / "fox.png")), expected)
    service.close()
    engine.close()


def test_a_request_stopped_between_two_blocks_is_cancelled_not_failed(tmp_path):
    from omni_console.engine.running.runner import RequestCancelled as StoppedBetweenBlocks

    engine = GatedEngine(tmp_path)

    def stopped(request, cancel=None):
        raise StoppedBetweenBlocks(1, 4)  # the runner's cancel between blocks: 1 of 4 steps done

    engine.generate = stopped
    sub = engine.bus.subscribe()
    service = RequestService(engine, history=History(tmp_path / "cache" / "history.json"))
    try:
        outcome = service.wait(service.submit(checked(tmp_path, "stopped")))
    finally:
        service.close()
    assert outcome.state == "cancelled" and isinstance(outcome.exception, StoppedBetweenBlocks)
    assert [(type(e).__name__, getattr(e, "running", None)) for e in events_of(sub, (RequestCancelled, RequestFailed))
            ] == [("RequestCancelled", True)]
    assert [e.status for e in service.history.entries] == ["cancelled"]
    assert not (tmp_path / "stopped.png").exists()
