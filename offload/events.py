"""One typed, timestamped, thread-safe event stream from the engine to its observers.

The engine and the offload runtime publish; the console (or a headless reporter) subscribes.
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

Direction = Literal["h2d", "d2h"]


def now() -> float:
    """Event timestamps: seconds on the monotonic clock (comparable within one process)."""
    return time.monotonic()


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event; `t` is `time.monotonic()` at creation (in the process that made it).
    `rank`: which rank of a multi-GPU group published it (`engine.rank_group` sets it as it
    forwards the event to the leader); None for an engine in this process."""

    t: float = field(default_factory=now)
    rank: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStateChanged(Event):
    old: str
    new: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadProgress(Event):
    """Bytes of one component placed so far (host pinning or device placement)."""

    component: str
    done_bytes: int
    total_bytes: int
    phase: str = "load"


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

    @property
    def gbps(self) -> float:
        """Decimal gigabytes per second; 0.0 when the duration is not measurable."""
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


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
class OomStepDown(Event):
    """A request's phase ran out of device memory: the cache was released, the policy stepped down
    (`action`: fewer resident blocks, a smaller ring, a leaner phase) and that phase's call retried once."""

    request_id: int
    phase: str  # text_encoding, denoise or vae_decode
    component: str  # whose call ran out (e.g. transformer, text_encoder_2, vae)
    action: str
    message: str = ""  # the first line of the out-of-memory error


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTiming(Event):
    """One denoise step: wall time and the time compute waited on weight transfers.

    `sync_fetches`: DiT blocks the streamer had to copy synchronously (the ring's order missed them;
    after the first step of a request, with the order checked against the first forward: 0)."""

    request_id: int
    step: int
    total_steps: int
    wall_s: float
    stall_s: float
    h2d_bytes: int = 0
    sync_fetches: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestStarted(Event):
    request_id: int
    prompt: str
    steps: int
    height: int
    width: int
    seed: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFinished(Event):
    request_id: int
    seconds: float
    ok: bool
    error: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestPhases(Event):
    """Where a finished request's time went, published once after it ends.

    `phases` holds seconds per measured phase: "text_encoding" (call start to the first DiT forward),
    "denoise" (first DiT forward to the last step end), "vae_decode" (the VAE's decode calls); a phase
    that did not run is absent. `latent_shape` is the shape of the latents the VAE decoded (else of the
    step-end latents); `vae_decode_peak_bytes` the device allocator's peak during decode (CUDA only).
    """

    request_id: int
    frames: int
    latent_shape: tuple[int, ...] | None
    phases: dict[str, float]
    vae_decode_peak_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Replanned(Event):
    """A live re-plan between requests: what moved and how long it took (no disk was read).

    `copied_bytes`: weights copied host→device (blocks and components made resident);
    `freed_bytes`: device weights released (made streamed or staged; their masters stay pinned);
    `ring_bytes`: the streaming ring's warm-up copies; `seconds`: wall time, synchronized."""

    summary: str
    copied_bytes: int
    freed_bytes: int
    ring_bytes: int
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockOrderCorrected(Event):
    """A DiT's first forward ran its block lists in another order than the plan's (read from source):
    the streamer, the plan and the profile follow the observed order from then on (and it is cached,
    so later plans of this model show it). `planned` / `observed`: the block lists, in each order."""

    dit: str
    planned: tuple[str, ...]
    observed: tuple[str, ...]
    summary: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertSwitched(Event):
    """Two experts share the device budget (Wan 2.2 A14B): one expert's resident blocks were released and
    the other's placed, from their pinned masters.

    `reason`: "boundary" (the pipeline called the other expert: diffusers' boundary step) or "request end"
    (back to the first expert, so every request starts as the load left it). `timestep`: the timestep of
    the forward that triggered it (None at the request's end). `copied_bytes`: the new expert's resident
    blocks copied host→device; `freed_bytes`: the old expert's released; `ring_bytes`: the ring's warm-up
    copies; `seconds`: wall time, synchronized."""

    request_id: int | None
    from_expert: str
    to_expert: str
    reason: str
    timestep: float | None
    copied_bytes: int
    freed_bytes: int
    ring_bytes: int
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ForecastCheck(Event):
    """Predicted vs measured after a request: device peak (bytes) and median step time (seconds).

    A prediction is None when nothing could predict it (no profile of this model on this device
    yet); a measurement is None where the device cannot report it (peak on a CPU). `*_source` says
    where the prediction came from: cached, estimated or unknown."""

    request_id: int
    predicted_peak: int | None
    measured_peak: int | None
    peak_source: str
    predicted_step_s: float | None
    measured_step_s: float | None
    step_source: str
    peak_basis: str = ""  # the prediction's basis: "cached", "scaled from 64x64", "estimated from config"
    step_basis: str = ""

    @staticmethod
    def error(predicted: float | None, measured: float | None) -> float | None:
        """(predicted - measured) / measured, or None."""
        if predicted is None or not measured:
            return None
        return (predicted - measured) / measured

    @property
    def peak_error(self) -> float | None:
        return self.error(self.predicted_peak, self.measured_peak)

    @property
    def step_error(self) -> float | None:
        return self.error(self.predicted_step_s, self.measured_step_s)


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
