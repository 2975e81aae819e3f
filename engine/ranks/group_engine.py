"""N GPUs behind the engine's own interface, so the console drives a rank group like one engine.

`GroupEngine` discovers the model in the leader's process (bad input fails here, before any rank
starts), starts the rank processes (`engine.ranks.rank_group`) ahead when asked (`prepare`: the console
does it when the model is opened) or when a load begins, and stops them on unload, quit or
failure: every rank's device and pinned memory leaves with its process. Each rank samples its own
GPU and forwards its events tagged with its rank; they arrive on this engine's bus.

A request runs on every rank at once: data-parallel ranks take the seeds `seed … seed+N−1` (the
result is rank 0's, with the others' in `GenerateResult.rank_results`), CFG-parallel ranks one
request (`RankLayout.rank_requests`). Every rank's own load report and result also come back whole
(`LoadReport.ranks`, `GenerateResult.ranks`): `run --gpus` reports them rank by rank. Cancelling
stops the whole group — the ranks gather blocks in lockstep, so one rank cannot stop at a step while
another waits for it — and the model must be loaded again. Live re-plan is not
offered: AllGather ranks hold only their shards.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ...offload.errors import PolicyError
from ...offload.events import EventBus, LogEvent
from ...offload.policy import OffloadPolicy
from ..engine import GenerateResult, LoadReport
from ..errors import ConfigError
from ..lifecycle import EngineState, EngineStateError, Lifecycle
from ..loading.loader import LoadCancelled, first_line
from ..model_dir.discovery import ModelInfo, discover_model
from ..options import EngineOptions
from ..planning.plan import Plan, make_plan
from ..planning.request_forecast import RequestForecast
from ..planning.request_profile import RequestSize, device_name
from ..running.call_options import default_fps
from ..running.runner import GenerateRequest
from .rank_checks import check_experts, check_parallel
from .rank_group import GroupCancelled, RankFailed, RankGroup
from .rank_layout import RankLayout

RANK_TELEMETRY_HZ = 5.0  # each rank's samples cross a process queue: half the console's own default rate


class GroupEngine(Lifecycle):
    """A model served by `layout.gpus` rank processes; an `api.EngineHandle` like `Engine`."""

    def __init__(self, model_path: str | Path, layout: RankLayout, *, device_kind: str, bus: EventBus | None = None,
                 variant: str | None = None, telemetry_hz: float | None = RANK_TELEMETRY_HZ,
                 log_dir: Path | None = None, options: EngineOptions | None = None) -> None:
        """`log_dir`: where each rank writes its own output (a console owns the terminal); None: inherited.
        `options`: every rank's engine options (no live re-plan: that needs one GPU)."""
        if options is not None and options.live_replan:
            raise ConfigError("live re-plan needs one GPU")
        self.options = options
        self.model: ModelInfo = discover_model(model_path, variant)
        check_parallel(layout, self.model.pipeline_class)
        check_experts(layout, self.model)
        self.layout = layout
        self.device_kind = device_kind
        self.device = torch.device("cuda:0") if device_kind == "cuda" else torch.device("cpu")
        self.variant = variant
        self.bus = bus or EventBus()
        self.telemetry_hz = telemetry_hz
        self.log_dir = log_dir
        self.state = EngineState.DISCOVERED
        self.failure: str | None = None
        self.plan: Plan | None = None
        self.group: RankGroup | None = None
        self._lock = threading.RLock()

    @property
    def world(self) -> int:
        return self.layout.gpus

    @property
    def device_name(self) -> str:
        return f"{self.world}× {device_name(self.device)}"

    @property
    def live_replan(self) -> bool:
        """Never: AllGather ranks hold only their shards, so a policy change is a new load."""
        return False

    @property
    def placement(self) -> None:
        """None: each rank places the model in its own process; nothing is placed in this one."""
        return None

    @property
    def pipe(self) -> None:
        """None: the pipelines live in the rank processes."""
        return None

    @property
    def fps(self) -> float | None:
        return default_fps(self.model)

    def make_plan(self, policy: OffloadPolicy) -> Plan:
        """One rank's plan (every rank runs the same one; `plan --gpus` shows the per-rank forecast)."""
        return make_plan(self.model, policy)

    def forecast(self, size: RequestSize, plan: Plan | None = None, probe_bandwidth: float | None = None
                 ) -> RequestForecast | None:
        """No whole-request forecast across ranks yet: `plan --gpus` gives the per-rank step floor."""
        return None

    def prepare(self, cancel: threading.Event | None = None) -> float:
        """Start the rank processes now: each spawns, joins torch.distributed and imports the model's
        classes, so that a load only reads. The console calls this when a model is opened, while the
        operator reads the plan (as `Engine.prepare` imports the classes). A start that fails or is
        cancelled here is one log line, not an error: the load starts the ranks again and reports what
        fails then. Seconds taken (0 when the ranks are up already)."""
        with self._lock:
            if self.group is not None or self.state not in (EngineState.DISCOVERED, EngineState.UNLOADED):
                return 0.0
            start = time.perf_counter()
            try:
                self.group = self._start_group(cancel)
            except RankFailed as exc:
                self.bus.publish(LogEvent(level="warning", message=f"ranks not started ahead of the load: {exc}"))
                return time.perf_counter() - start
            seconds = time.perf_counter() - start
            self.bus.publish(LogEvent(level="info", message=(
                f"{self.world} ranks started in {seconds:.1f} s, the model's classes imported; "
                f"a load starts reading at once")))
            return seconds

    def replan(self, policy: OffloadPolicy) -> Any:
        raise EngineStateError("live re-plan needs one GPU: unload (u), change the policy, load (l)")

    # ---------------------------------------------------------------- load / unload
    def load(self, policy: OffloadPolicy, cancel: threading.Event | None = None, tiers: Any = None) -> LoadReport:
        if tiers is not None and not tiers.all_pinned:  # --ram-budget with --gpus is refused before (plan_for)
            raise PolicyError("blocks read from the page cache or disk are not streamed across several GPUs yet")
        with self._lock:
            self._check_loadable()
            plan = self.make_plan(policy)
            self.plan, self.failure = plan, None
            self._set_state(EngineState.LOADING, f"{self.world} ranks · {self.layout.describe()}")
            start = time.perf_counter()
            started_s: float | None = None
            try:
                if self.group is None:  # not started ahead by `prepare`
                    self.group = self._start_group(cancel)
                    started_s = time.perf_counter() - start
                reports = self.group.load(policy, cancel=cancel)
            except BaseException as exc:
                self._stop_group()
                reason = "load cancelled" if isinstance(exc, GroupCancelled) else first_line(exc)
                self._fail("load", reason)
                if isinstance(exc, GroupCancelled):
                    raise LoadCancelled(reason) from None
                raise
            seconds = time.perf_counter() - start
            if self.log_dir is not None:
                self.bus.publish(LogEvent(level="info", message=f"ranks' own output: {self.log_dir}/rank*.log"))
            for rank, report in enumerate(reports):
                self.bus.publish(LogEvent(level="info", message=(
                    f"rank {rank}: loaded in {report.seconds:.2f} s, {report.pinned_bytes:,} bytes pinned "
                    f"({report.block_host_bytes:,} of them DiT blocks)")))
            self._set_state(EngineState.READY)
            first = reports[0]
            milestones = dict(first.milestones)
            if started_s is not None:  # the ranks' own milestones count from their load, after the start
                milestones = {"ranks_started": started_s, **{k: v + started_s for k, v in milestones.items()}}
            return replace(first, seconds=seconds, pinned_bytes=sum(r.pinned_bytes for r in reports),
                           milestones=milestones, ranks=tuple(reports))

    def unload(self) -> None:
        with self._lock:
            self._check_unloadable()
            self._stop_group()
            self._set_state(EngineState.UNLOADED)

    def close(self) -> None:
        with self._lock:
            stopped = self.group is not None
            self._stop_group()
            if stopped or self.holds_anything:
                self._set_state(EngineState.UNLOADED, "closed")

    # ---------------------------------------------------------------- generate
    def generate(self, request: GenerateRequest, cancel: threading.Event | None = None) -> GenerateResult:
        with self._lock:
            self._check_ready()
            if self.group is None:  # a ready group always has its ranks; said as the state guard would
                raise EngineStateError(f"cannot generate while {self.state.value}; load first")
            requests = self.layout.rank_requests(request)
            self._set_state(EngineState.RUNNING, f"{self.world} ranks")
            try:
                results = self.group.generate(requests, cancel=cancel)
            except BaseException as exc:
                self._stop_group()
                reason = ("request cancelled: every rank stopped and released its memory; load again"
                          if isinstance(exc, GroupCancelled) else first_line(exc))
                self._fail("generate", reason)
                raise RankFailed(reason) from None
            self._set_state(EngineState.READY)
            others = tuple(results[1:]) if self.layout.parallel == "dp" else ()
            return replace(results[0], rank_results=others, ranks=tuple(results))

    # ---------------------------------------------------------------- internals
    def _start_group(self, cancel: threading.Event | None) -> RankGroup:
        return RankGroup(self.model.path, self.layout, self.device_kind, variant=self.variant, bus=self.bus,
                         telemetry_hz=self.telemetry_hz, log_dir=self.log_dir, cancel=cancel, options=self.options)

    def _stop_group(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.close()
