"""EngineAnswers without Textual: a value the UI thread may not compute is asked of the engine thread once per
key, shown as pending until its answer is back, and an answer for a key no longer shown is dropped."""

from __future__ import annotations

from concurrent.futures import Future

from omni_console.console.engine_answers import PENDING, EngineAnswers


class FakeWorker:
    """`EngineWorker.call` with the engine thread driven by the test: `run()` answers what was asked."""

    def __init__(self, engine: object) -> None:
        self.engine = engine
        self.queued: list[tuple[Future, object]] = []
        self.closed = False

    def call(self, fn) -> Future:
        if self.closed:
            raise RuntimeError("engine worker is shut down")
        future: Future = Future()
        self.queued.append((future, fn))
        return future

    def run(self) -> None:
        queued, self.queued = self.queued, []
        for future, fn in queued:
            try:
                future.set_result(fn(self.engine))
            except Exception as exc:  # noqa: BLE001 - delivered through the future, as the worker does
                future.set_exception(exc)


def make(engine: object = None):
    worker = FakeWorker(engine)
    posted: list[tuple[object, Future]] = []
    return worker, posted, EngineAnswers(worker.call, lambda key, f: posted.append((key, f)))


def deliver(answers: EngineAnswers, posted: list) -> list[BaseException | None]:
    """The UI thread's side: each posted answer handed to `answered`, in order."""
    out = [answers.answered(key, future) for key, future in posted]
    posted.clear()
    return out


def test_asked_once_pending_until_answered_then_kept_for_its_key():
    worker, posted, answers = make(engine={"forecast": 42})
    assert answers.get("a", lambda engine: engine["forecast"]) is PENDING and answers.pending
    assert answers.get("a", lambda engine: engine["forecast"]) is PENDING  # telemetry redraws ask again
    assert len(worker.queued) == 1  # ... for nothing
    worker.run()
    assert deliver(answers, posted) == [None]
    assert not answers.pending
    assert answers.get("a", lambda engine: 0) == 42 and worker.queued == []


def test_an_answer_for_a_key_no_longer_shown_is_dropped():
    worker, posted, answers = make()
    answers.get("old", lambda _engine: "old figures")
    answers.get("new", lambda _engine: "new figures")
    worker.run()
    deliver(answers, posted)
    assert answers.get("new", lambda _engine: None) == "new figures"
    assert answers.get("old", lambda _engine: "asked again") is PENDING  # the stale one was not kept
    worker.run()
    deliver(answers, posted)
    assert answers.get("old", lambda _engine: None) == "asked again"


def test_a_stale_answer_arriving_late_does_not_replace_the_shown_one():
    worker, posted, answers = make()
    answers.get("old", lambda _engine: "old figures")
    worker.run()
    late = list(posted)
    posted.clear()
    answers.get("new", lambda _engine: "new figures")
    worker.run()
    deliver(answers, posted)
    deliver(answers, late)
    assert answers.get("new", lambda _engine: None) == "new figures" and not answers.pending


def test_a_failed_answer_is_unknown_and_its_error_returned():
    worker, posted, answers = make()

    def broken(_engine):
        raise OSError("profile cache unreadable")

    answers.get("k", broken)
    worker.run()
    (exc,) = deliver(answers, posted)
    assert isinstance(exc, OSError) and str(exc) == "profile cache unreadable"
    assert answers.get("k", broken) is None and not answers.pending


def test_nothing_is_asked_of_a_worker_that_has_shut_down():
    worker, posted, answers = make()
    worker.closed = True
    assert answers.get("k", lambda _engine: 1) is PENDING and posted == []
    worker.closed = False
    assert answers.get("k", lambda _engine: 1) is PENDING and len(worker.queued) == 1  # asked once it can be
