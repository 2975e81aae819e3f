"""Engine events → the state the screens show, and when each part of the live screen is redrawn.

No Textual here: the app drains its bus subscription on a timer and hands the events to
`EventRouter.route`; the router keeps what outlives a screen (latest telemetry sample and its
history, the request's number, the observed bandwidth), queues what the live screen shows, and returns
the engine's plan and state (`PlanReady`, `EngineStateChanged`) for the app's `ConsoleSession`.
`flush` then decides which redraws are due: the request's line and progress bar at most every
LIGHT_UI_S, the heavy groups (staging log, memory panels, step table) at most every HEAVY_UI_S
(HEAVY_UI_BUSY_S while a request runs) and one group per tick. Every event is applied — histories
get every sample, the log every line; only redraws are grouped, so the UI thread, which shares the
GIL with the engine, stays mostly idle.

A multi-GPU group forwards every rank's events tagged with its rank (`Event.rank`; None is this
process). Each rank's telemetry and steps go to its `RankStats` (the GPU group panel, redrawn with
the heavy groups); only the console's own telemetry (rank None) feeds the memory panels, and only
rank None or 0 drives the request line, the step table and the load progress, so N ranks running
the same steps do not show N times. Every rank's staging and log lines reach the staging log.

The live screen is reached only through the `LiveView` protocol, so pacing and routing are
unit-tested with a plain recorder object and a fake clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..engine import events
from ..engine.api import TelemetrySnapshot
from ..offload.units import format_seconds
from .bandwidth import ObservedBandwidth
from .event_text import loading_line
from .rank_stats import RankStats
from .request_record import RequestRecord

LIGHT_UI_S = 0.25
"""The request's progress bar and line redraw at most this often."""
HEAVY_UI_S = 0.5
HEAVY_UI_BUSY_S = 1.0
"""Staging log, memory panels, step table, residency and GPU group redraw at most this often (idle / while a
request runs); no sample, step or event is skipped, they are applied in groups."""
LOG_EVENTS = (events.StagingEvent, events.BlocksSkipped, events.CacheDecision, events.OomRetry, events.OomStepDown,
              events.LogEvent, events.ErrorEvent, events.Replanned, events.ExpertSwitched, events.CompilePhase)


class LiveView(Protocol):
    """What the router drives on the live screen (LiveScreen implements it)."""

    telemetry_ready: bool
    """False until the screen has replayed the telemetry history; samples are queued only after that."""

    def add_log(self, events: list[events.Event]) -> None: ...
    def show_dropped(self, dropped: int) -> None: ...
    def show_snapshots(self, snapshots: list[TelemetrySnapshot]) -> None: ...
    def add_steps(self, steps: list[events.StepTiming]) -> None: ...
    def show_step_progress(self, step: events.StepTiming) -> None: ...
    def set_generation(self, text: str, done: int | None = None, total: int | None = None) -> None: ...
    def show_phases(self, event: events.RequestPhases) -> None: ...

    def show_check(self, event: events.ForecastCheck) -> None: ...
    def show_loras(self, event: events.LorasApplied) -> None: ...
    def show_residency(self, rows: tuple[tuple[str, str, int], ...]) -> None: ...
    def show_ranks(self, ranks: Mapping[int, RankStats]) -> None: ...
    def show_step_preview(self, event: events.StepPreview) -> None: ...


@dataclass
class Routed:
    """What one batch changed outside the live screen: the app acts on these."""

    count: int = 0
    telemetry: bool = False
    """A new telemetry sample arrived (the plan screen's header and forecast may change)."""
    state_changed: bool = False
    """The engine changed state (the live screen's status line names it)."""
    engine: list[events.Event] = field(default_factory=list)
    """This process's engine's own news for the session, in order: its `PlanReady` and `EngineStateChanged`."""
    load_progress: dict[str, events.LoadProgress] = field(default_factory=dict)
    """The newest progress per component, while loading."""
    load_lines: list[str] = field(default_factory=list)
    """The loading log's new lines, while loading."""


class EventRouter:
    """Routes engine events to the live screen's queues and paces its redraws."""

    def __init__(self, *, on_cpu: bool, history: int, clock: Callable[[], float] = time.monotonic) -> None:
        """`on_cpu`: transfers are host copies (the loading log says so, no bandwidth is observed).
        `history`: telemetry samples kept for the sparklines (the live screen replays them when shown)."""
        self.on_cpu = on_cpu
        self.clock = clock
        self.snapshot: TelemetrySnapshot | None = None
        self.telemetry_history: deque[TelemetrySnapshot] = deque(maxlen=history)
        self.request_id: int | None = None
        """The engine's number of the request running or last run (from its RequestStarted event)."""
        self.observed = ObservedBandwidth()
        self.ranks: dict[int, RankStats] = {}
        """Per rank of a multi-GPU group (empty for a single engine): newest sample, steps of its request."""
        self.live: LiveView | None = None
        self._t0: float | None = None
        self._heavy_at = [0.0] * 5  # log, memory, steps, ranks, residency: when each was last redrawn
        self._ranks_changed = False
        self._light_at = 0.0
        self._progress: events.StepTiming | None = None
        self._generation: str | None = None
        self._snapshots: list[TelemetrySnapshot] = []
        self._steps: list[events.StepTiming] = []
        self._log: list[events.Event] = []
        self.residency: tuple[tuple[str, str, int], ...] | None = None
        """The engine's latest residency rows (its ResidencySnapshot); None until one arrives after a load."""
        self._residency_pending = False
        self._preview: events.StepPreview | None = None
        """The newest step preview not yet drawn (a newer one replaces it: only the newest is worth drawing)."""
        self.previews_dropped = 0
        self.record = RequestRecord()
        """The request running or last run: what the plot screen draws and the trace key writes."""

    # ---- the live screen's life ------------------------------------------------------------

    def start_load(self, live: LiveView) -> None:
        """A load begins: its events go to this (not yet shown) live screen; loading times start at 0."""
        self.detach()
        self.live = live
        self._t0 = None
        self.ranks = {}  # a group's ranks start with its load: the last load's numbers are stale
        self.residency = None

    def detach(self) -> None:
        """The live screen is gone (load failed, unloaded): nothing queued for it is kept."""
        self.live = None
        self._progress = self._generation = None
        self._snapshots, self._steps, self._log = [], [], []
        self._ranks_changed = False
        self._residency_pending = False
        self._preview = None

    # ---- events ------------------------------------------------------------------------------

    def route(self, batch: Iterable[events.Event], *, loading: bool, dropped: int = 0) -> Routed:
        """Apply every event: state here, queues for the live screen, loading rows for the plan screen."""
        routed = Routed()
        live = self.live
        if live is not None:
            live.show_dropped(dropped)
        record = self.record
        for event in batch:
            routed.count += 1
            self._apply(event, routed, loading)
            record.add(event)
        return routed

    def _rank(self, rank: int) -> RankStats:
        stats = self.ranks.get(rank)
        if stats is None:
            stats = self.ranks[rank] = RankStats(rank)
        self._ranks_changed = True
        return stats

    def _apply_rank(self, event: events.Event, rank: int) -> bool:
        """A rank's own telemetry and steps (its stats); True when nothing else is to be done with it."""
        if isinstance(event, events.TelemetryEvent):
            if isinstance(event.snapshot, TelemetrySnapshot):
                self._rank(rank).snapshot = event.snapshot
            return True  # a rank's sample is not the console's: no memory panel, no history
        if isinstance(event, events.StepTiming):
            self._rank(rank).add_step(event)
        elif isinstance(event, events.RequestStarted):
            self._rank(rank).start_request(event.request_id)
        # the request's line, progress and load progress: rank 0 speaks for the group
        return rank != 0 and isinstance(event, (events.StepTiming, events.RequestStarted, events.RequestFinished,
                                                events.RequestPhases, events.ForecastCheck, events.LoadProgress))

    def _apply(self, event: events.Event, routed: Routed, loading: bool) -> None:
        live = self.live
        rank = event.rank
        if rank is not None and self._apply_rank(event, rank):
            return
        if isinstance(event, events.TelemetryEvent):
            snapshot = event.snapshot
            if isinstance(snapshot, TelemetrySnapshot):
                self.snapshot = snapshot
                self.telemetry_history.append(snapshot)
                if live is not None and live.telemetry_ready:
                    self._snapshots.append(snapshot)
                routed.telemetry = True
            return
        if loading:
            if isinstance(event, events.LoadProgress):
                routed.load_progress[event.component] = event
            if self._t0 is None:
                self._t0 = event.t
            line = loading_line(event, self._t0, on_cpu=self.on_cpu)
            if line is not None:
                routed.load_lines.append(line if rank is None else f"r{rank} {line}")
        if isinstance(event, events.PlanReady):
            if rank is None:  # a group's ranks each run the plan the group announced
                routed.engine.append(event)
            return
        if isinstance(event, events.LorasApplied):
            if rank is None and live is not None:  # rare (a load, a switch, a re-plan): shown at once
                live.show_loras(event)
            return
        if isinstance(event, events.ResidencySnapshot):
            if rank is None:  # this process's engine (a group's ranks keep theirs: no rows, as before)
                self.residency = event.rows
                self._residency_pending = live is not None
            return
        if isinstance(event, LOG_EVENTS):
            if isinstance(event, events.StagingEvent) and not self.on_cpu:
                self.observed.observe(event)
            if live is not None:
                self._log.append(event)
        elif isinstance(event, events.StepTiming):
            if live is not None:
                self._steps.append(event)
                self._progress = event
            self._set_generation(f"request {event.request_id}: step {event.step}/{event.total_steps} · "
                                 f"last step {format_seconds(event.wall_s)} (stall {format_seconds(event.stall_s)})")
        elif isinstance(event, events.StepPreview):
            if live is not None:
                self.previews_dropped += self._preview is not None
                self._preview = event
        elif isinstance(event, events.RequestStarted):
            self.request_id = event.request_id
            self._set_generation(f"request {event.request_id}: {event.prompt!r} · started")
        elif isinstance(event, events.RequestPhases):
            if live is not None:
                live.show_phases(event)  # once per request: applied at once, not batched
        elif isinstance(event, events.ForecastCheck):
            if live is not None:
                live.show_check(event)
        elif isinstance(event, events.RequestFinished) and not event.ok:
            self._set_generation(f"request {event.request_id} failed: {event.error}")
        elif isinstance(event, events.EngineStateChanged):
            routed.state_changed = True
            if rank is None:
                routed.engine.append(event)

    def _set_generation(self, text: str) -> None:
        if self.live is not None:
            self._generation = text

    # ---- redraws -------------------------------------------------------------------------------

    def has_pending(self) -> bool:
        return bool(self._log or self._steps or self._snapshots or self._ranks_changed or self._residency_pending
                    or self._progress is not None or self._generation is not None or self._preview is not None)

    def flush(self, *, busy: bool, force: bool = False) -> None:
        """Redraw what is due (everything when `force`): the light widgets, then at most one heavy group."""
        live = self.live
        if live is None:
            return
        self._flush_light(live, force)
        self._flush_heavy(live, busy, force)

    def _flush_light(self, live: LiveView, force: bool) -> None:
        """Every LIGHT_UI_S: the request's progress bar and line (two cheap widgets)."""
        now = self.clock()
        if not force and now - self._light_at < LIGHT_UI_S:
            return
        self._light_at = now
        if self._progress is not None:
            last, self._progress = self._progress, None
            live.show_step_progress(last)
        if self._generation is not None:
            text, self._generation = self._generation, None
            live.set_generation(text)
        if self._preview is not None:
            preview, self._preview = self._preview, None
            live.show_step_preview(preview)

    def _flush_heavy(self, live: LiveView, busy: bool, force: bool) -> None:
        """Staging log, memory panels (all pending samples), step table, residency, GPU group — staggered.

        These are the widgets whose redraw costs the most (a log or table growing re-lays-out the
        screen; tables have hundreds of cells). Each group is redrawn at most every HEAVY_UI_S
        (HEAVY_UI_BUSY_S during a request), and at most one group per tick unless forced: a key
        press then never waits behind the whole batch, only behind one group.
        """
        now = self.clock()
        interval = HEAVY_UI_BUSY_S if busy else HEAVY_UI_S
        groups = (self._flush_log, self._flush_memory, self._flush_steps, self._flush_ranks, self._flush_residency)
        for index in sorted(range(len(groups)), key=lambda i: self._heavy_at[i]):  # most overdue first
            if not force and now - self._heavy_at[index] < interval:
                continue
            if groups[index](live) and not force:
                self._heavy_at[index] = now
                return
            self._heavy_at[index] = now

    def _flush_log(self, live: LiveView) -> bool:
        """The staging log (the residency rows the same moves changed follow as their own group)."""
        if not self._log:
            return False
        batch, self._log = self._log, []
        live.add_log(batch)
        return True

    def _flush_memory(self, live: LiveView) -> bool:
        if not (live.telemetry_ready and self._snapshots):
            return False
        pending, self._snapshots = self._snapshots, []
        live.show_snapshots(pending)
        return True

    def _flush_steps(self, live: LiveView) -> bool:
        if not self._steps:
            return False
        steps, self._steps = self._steps, []
        live.add_steps(steps)
        return True

    def _flush_residency(self, live: LiveView) -> bool:
        """The residency panel: the engine's latest snapshot's rows (the engine publishes only changes)."""
        if not self._residency_pending or self.residency is None:
            return False
        self._residency_pending = False
        live.show_residency(self.residency)
        return True

    def _flush_ranks(self, live: LiveView) -> bool:
        """The GPU group panel: one line per rank (only a multi-GPU group's events change the ranks)."""
        if not self._ranks_changed:
            return False
        self._ranks_changed = False
        live.show_ranks(self.ranks)
        return True
