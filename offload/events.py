"""One typed, timestamped, thread-safe event stream from the engine to its observers.

The engine and the offload runtime publish; the console (or a headless reporter) subscribes. This module
holds the bus, the `Event` base and the runtime's own events; the engine's and a request's events
(state, load progress, steps, re-plans, forecast checks) are in `engine/events.py`.
Publishing never blocks: each subscriber owns a bounded queue, and when a slow subscriber's
queue is full the oldest event is dropped and counted, so the engine never waits on the UI and
the UI can always say how many events it missed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from .tiers import Tier

Direction = Literal["h2d", "d2h"]


def now() -> float:
    """Event timestamps: seconds on the monotonic clock (comparable within one process)."""
    return time.monotonic()


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event; `t` is `time.monotonic()` at creation (in the process that made it).
    `rank`: which rank of a multi-GPU group published it (`engine.ranks.rank_group` sets it as it
    forwards the event to the leader); None for an engine in this process."""

    t: float = field(default_factory=now)
    rank: int | None = None




@dataclass(frozen=True, slots=True, kw_only=True)
class BlocksSkipped(Event):
    """A run of streamed blocks a step cache skipped in one forward, in execution order: none of them was copied
    (one event per run, not per block)."""

    first: str
    last: str
    blocks: int
    nbytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StagingEvent(Event):
    """One host<->device transfer of a staged component or a streamed DiT block.

    `seconds` is the transfer's own duration (CUDA events on a GPU, wall time on CPU);
    `sync` is True when the transfer was made synchronously (an unmaterialized block).
    """

    target: str
    direction: Direction
    nbytes: int
    seconds: float
    sync: bool = False
    tier: Tier = "pinned"  # where its bytes came from on the host (offload/tiers.py)
    start: float | None = None  # monotonic time it began (CPU) or was issued on its stream (CUDA); None: unknown

    @property
    def gbps(self) -> float:
        """Decimal gigabytes per second; 0.0 when the duration is not measurable."""
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockTiming(Event):
    """A streamed block's forward on the compute stream (`kind` "compute"), or the compute stream's wait for
    the block's copy before it (`kind` "stall", CUDA only): what a trace draws on the compute track.

    `start`: monotonic time it began (CPU) or was issued (CUDA: the device runs it at that time or later)."""

    target: str
    kind: Literal["compute", "stall"]
    seconds: float
    start: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheDecision(Event):
    """Allocator cache retention decision at a component boundary (the rule is in offload/cache.py)."""

    action: Literal["retain", "release"]
    reason: str
    forced: bool = False
    context: str = ""  # which boundary asked, e.g. "after offloading vae"
    reserved: int | None = None
    allocated: int | None = None
    cached: int | None = None
    free: int | None = None
    total: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OomRetry(Event):
    """A staging load ran out of device memory; the cache was released and the load retried once."""

    component: str
    nbytes: int
    attempt: int
    message: str = ""










@dataclass(frozen=True, slots=True, kw_only=True)
class TelemetryEvent(Event):
    """A telemetry snapshot (an `offload.telemetry.TelemetrySnapshot`)."""

    snapshot: object


@dataclass(frozen=True, slots=True, kw_only=True)
class LogEvent(Event):
    """A human-readable line worth showing an operator (placements, warnings)."""

    level: Literal["info", "warning", "error"]
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorEvent(Event):
    where: str
    message: str


class Subscription:
    """A bounded queue of events for one consumer; the oldest events are dropped when full."""

    def __init__(self, bus: EventBus, maxlen: int) -> None:
        self._bus = bus
        self._queue: deque[Event] = deque()
        self._maxlen = maxlen
        self._lock = threading.Lock()
        self._dropped = 0

    def _offer(self, event: Event) -> None:
        with self._lock:
            if len(self._queue) >= self._maxlen:
                self._queue.popleft()
                self._dropped += 1
            self._queue.append(event)

    def drain(self, max_events: int | None = None) -> list[Event]:
        """Take up to `max_events` queued events (all when None), oldest first."""
        with self._lock:
            n = len(self._queue) if max_events is None else min(max_events, len(self._queue))
            return [self._queue.popleft() for _ in range(n)]

    @property
    def dropped(self) -> int:
        """Events this subscriber lost because it fell behind."""
        return self._dropped

    def __len__(self) -> int:
        return len(self._queue)

    def close(self) -> None:
        self._bus._unsubscribe(self)


class EventBus:
    """Fan-out of events to subscribers; `publish` is O(subscribers) and never blocks on them."""

    def __init__(self) -> None:
        self._subscribers: list[Subscription] = []
        self._lock = threading.Lock()
        self.published = 0

    def subscribe(self, maxlen: int = 100_000) -> Subscription:
        sub = Subscription(self, maxlen)
        with self._lock:
            self._subscribers = [*self._subscribers, sub]
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subscribers = [s for s in self._subscribers if s is not sub]

    def publish(self, event: Event) -> None:
        self.published += 1
        for sub in self._subscribers:  # copy-on-write list: safe to iterate without the lock
            sub._offer(event)


class NullBus(EventBus):
    """A bus nobody listens to (library use without observers)."""

    def publish(self, event: Event) -> None:  # noqa: D401 - trivial
        return None
