"""Run engine commands on one background thread so a UI never blocks on the GPU.

Commands go down as method calls returning futures; progress comes back through the engine's
event bus. One thread means commands run in the order given; `cancel()` signals the command in
flight (a load stops between components/blocks, a generation at the next step end).

Why a plain daemon thread and not a `ThreadPoolExecutor`: a pipeline step on a big video model
can run for minutes inside one kernel, and nothing can interrupt it. `concurrent.futures` joins
its executor threads at interpreter exit, so a quit would wait for that step. A daemon thread
is never joined: `shutdown(timeout=...)` returns on time, the release (`engine.close()`) is
queued behind the command in flight and runs the moment it returns, and a process that must
exit before then can do so (the console restores the terminal, then `os._exit`s; the OS frees
the device and pinned memory — see `console.app_main`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from ..offload.policy import OffloadPolicy
from ..offload.tiers import HostTiers
from .handle import EngineHandle
from .results import GenerateResult, LoadReport
from .running.runner import GenerateRequest

T = TypeVar("T")
_Command = tuple[Future, Callable[[threading.Event], Any]]


class EngineWorker:
    def __init__(self, engine: EngineHandle) -> None:
        self.engine = engine
        self._queue: queue.SimpleQueue[_Command | None] = queue.SimpleQueue()
        self._cancel = threading.Event()
        self._lock = threading.Lock()  # orders "closed + cancel" against "start a command + clear cancel"
        self._closed = False
        self._running: Future | None = None
        self._released: Future[None] | None = None
        self._thread = threading.Thread(target=self._loop, name="omni-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the thread

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn = item
            with self._lock:
                if self._closed and future is not self._released:
                    future.cancel()  # queued before shutdown, never started: it will not run
                    continue
                if not future.set_running_or_notify_cancel():
                    continue
                self._running = future
                if future is not self._released:
                    self._cancel.clear()
            try:
                result = fn(self._cancel)
            except BaseException as exc:  # noqa: BLE001 - delivered to the caller through the future
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                with self._lock:
                    self._running = None
                del item, future, fn  # drop references to results (images, pipelines) right away

    def _submit(self, fn: Callable[[threading.Event], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("engine worker is shut down")
            self._queue.put((future, fn))
        return future

    # ------------------------------------------------------------------ commands

    def load(self, policy: OffloadPolicy, tiers: Callable[[EngineHandle], HostTiers] | None = None
             ) -> Future[LoadReport]:
        """`tiers`: the host tiers to load with, planned on this thread first (`--ram-budget`; its refusal fails
        the load in one line)."""
        if tiers is None:
            return self._submit(lambda cancel: self.engine.load(policy, cancel))
        return self._submit(lambda cancel: self.engine.load(policy, cancel, tiers=tiers(self.engine)))

    def generate(self, request: GenerateRequest) -> Future[GenerateResult]:
        return self._submit(lambda cancel: self.engine.generate(request, cancel))

    def unload(self) -> Future[None]:
        return self._submit(lambda _cancel: self.engine.unload())

    def prepare(self) -> Future[float]:
        """`engine.prepare`, cancellable like a load (a rank group's start stops on quit)."""
        return self._submit(lambda cancel: self.engine.prepare(cancel))

    def call(self, fn: Callable[[EngineHandle], Any]) -> Future[Any]:
        return self._submit(lambda _cancel: fn(self.engine))

    def command(self, fn: Callable[[threading.Event], T]) -> Future[T]:
        """Any work, in order with the other commands; `fn` gets the cancel event (the request service's
        run-and-write of one request)."""
        return self._submit(fn)

    def cancel(self) -> None:
        """Ask the command in flight to stop at its next safe point."""
        self._cancel.set()

    @property
    def busy(self) -> bool:
        """A command (or the final release) is still running on the worker thread."""
        with self._lock:
            return self._running is not None

    # ------------------------------------------------------------------ shutdown

    def request_shutdown(self, release: bool = True) -> Future[None]:
        """Never blocks: cancel what runs, drop what is queued, queue the release, stop accepting commands.

        Returns the release's future (idempotent: the same future every time). The release
        (`engine.close()`) runs on the worker thread right after the command in flight returns,
        then the thread ends. `release=False`: the engine is its owner's to close (a request service's
        own worker); the thread just ends.
        """
        with self._lock:
            if self._released is not None:
                return self._released
            self._closed = True
            self._cancel.set()
            released: Future[None] = Future()
            self._released = released
            self._queue.put((released, (lambda _cancel: self.engine.close()) if release else (lambda _cancel: None)))
            self._queue.put(None)
        return released

    def shutdown(self, timeout: float | None = None) -> bool:
        """`request_shutdown()`, then wait at most `timeout` s for the release; True once it is done.

        On a timeout the engine is still released, by the worker thread, as soon as the command in
        flight returns. A failed release is raised here.
        """
        released = self.request_shutdown()
        try:
            released.result(timeout=timeout)
        except TimeoutError:
            return False
        return True

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the worker thread to end (after `request_shutdown`); True when it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
