"""Values only the engine thread may compute, asked for by key and shown when they arrive.

A request forecast reads the live streamer's observed bandwidth and the profile cache on disk, so
the UI thread never computes it: it asks the worker (`EngineAnswers.get`), shows that the answer is
coming (`PENDING`), and redraws when the worker's answer has come back to it (`answered`). The
answer is kept for its key (the policy, the size, the link rate, the requests run: whatever it
depends on), so telemetry redraws ask again for nothing; an answer for a key the UI no longer shows
is dropped. No Textual here: the app posts the answer to its own thread.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..engine.api import EngineHandle


class _Pending:
    def __repr__(self) -> str:
        return "PENDING"


PENDING: Any = _Pending()
"""What `get` returns while the engine thread has not answered for the key."""

Key = Any
"""Compared with ==, never hashed (a policy holds a dict)."""

Submit = Callable[[Callable[["EngineHandle"], Any]], Future]
"""`EngineWorker.call`: runs a function of the engine on the engine thread."""


class EngineAnswers:
    """The answer for the key shown now, computed on the engine thread (one answer kept: the latest key's)."""

    def __init__(self, submit: Submit, on_done: Callable[[Key, Future], None]) -> None:
        """`on_done(key, future)` runs on the engine thread when an answer is ready: it hands both to the UI
        thread, which calls `answered`."""
        self._submit = submit
        self._on_done = on_done
        self._wanted: Key = PENDING
        self._answer: tuple[Key, Any] | None = None
        self._asked: list[Key] = []  # asked, not answered yet

    def get(self, key: Key, compute: Callable[[EngineHandle], Any]) -> Any:
        """The answer for `key`, or PENDING after asking for it (once per key until it is answered)."""
        self._wanted = key
        if self._answer is not None and self._answer[0] == key:
            return self._answer[1]
        if key not in self._asked:
            try:
                future = self._submit(compute)
            except RuntimeError:  # the worker is shut down: the app is quitting, nobody will read it
                return PENDING
            self._asked.append(key)
            future.add_done_callback(lambda f: self._on_done(key, f))
        return PENDING

    @property
    def pending(self) -> bool:
        """The key shown last is still waiting for the engine thread."""
        return self._wanted in self._asked

    def answered(self, key: Key, future: Future) -> BaseException | None:
        """On the UI thread: keep the answer when `key` is still the one shown (else drop it). An answer that
        failed is kept as None (the figures are unknown) and its exception returned, for the operator."""
        if key in self._asked:
            self._asked.remove(key)
        if key != self._wanted:
            return None  # stale: the policy or size changed while the engine thread computed it
        exc = None if future.cancelled() else future.exception()
        self._answer = (key, None if exc is not None or future.cancelled() else future.result())
        return exc

    def forget(self) -> None:
        """Drop the kept answer (the next `get` asks again)."""
        self._answer = None
