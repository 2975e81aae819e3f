"""Run engine commands on one background thread so a UI never blocks on the GPU.

Commands go down as method calls returning futures; progress comes back through the engine's
event bus. One thread means commands run in the order given; `cancel()` signals the command in
flight (a load stops between components/blocks, a generation at the next step end).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from ..offload.policy import OffloadPolicy
from .engine import Engine, GenerateResult, LoadReport
from .runner import GenerateRequest

T = TypeVar("T")


class EngineWorker:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omni-engine")
        self._cancel = threading.Event()
        self._closed = False

    def _submit(self, fn: Callable[[threading.Event], T]) -> Future[T]:
        if self._closed:
            raise RuntimeError("engine worker is shut down")

        def run() -> T:
            self._cancel.clear()
            return fn(self._cancel)

        return self._executor.submit(run)

    def load(self, policy: OffloadPolicy) -> Future[LoadReport]:
        return self._submit(lambda cancel: self.engine.load(policy, cancel))

    def generate(self, request: GenerateRequest) -> Future[GenerateResult]:
        return self._submit(lambda cancel: self.engine.generate(request, cancel))

    def unload(self) -> Future[None]:
        return self._submit(lambda _cancel: self.engine.unload())

    def call(self, fn: Callable[[Engine], Any]) -> Future[Any]:
        return self._submit(lambda _cancel: fn(self.engine))

    def cancel(self) -> None:
        """Ask the command in flight to stop at its next safe point."""
        self._cancel.set()

    def shutdown(self, timeout: float | None = None) -> None:
        """Cancel what runs, release the engine's memory on its own thread, stop the thread."""
        if self._closed:
            return
        self.cancel()
        future = self._executor.submit(self.engine.close)
        self._closed = True
        try:
            future.result(timeout=timeout)
        finally:
            self._executor.shutdown(wait=timeout is None, cancel_futures=True)
