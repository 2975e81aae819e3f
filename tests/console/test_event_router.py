"""EventRouter without Textual: which events reach which part of the live screen, and when it redraws."""

from __future__ import annotations

from omni_console.console.event_router import HEAVY_UI_BUSY_S, HEAVY_UI_S, LIGHT_UI_S, EventRouter
from omni_console.engine.events import (
    EngineStateChanged,
    LoadProgress,
    PlanReady,
    RequestFinished,
    RequestStarted,
    ResidencySnapshot,
    StepTiming,
)
from omni_console.offload.events import StagingEvent, TelemetryEvent
from omni_console.offload.telemetry import TelemetrySnapshot


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RecordingView:
    """A LiveView that records every call the router makes."""

    def __init__(self, telemetry_ready: bool = True) -> None:
        self.telemetry_ready = telemetry_ready
        self.calls: list[tuple[str, object]] = []

    def add_log(self, events): self.calls.append(("log", list(events)))
    def show_dropped(self, dropped): self.calls.append(("dropped", dropped))
    def show_snapshots(self, snapshots): self.calls.append(("snapshots", list(snapshots)))
    def add_steps(self, steps): self.calls.append(("steps", list(steps)))
    def show_step_progress(self, step): self.calls.append(("progress", step))
    def set_generation(self, text, done=None, total=None): self.calls.append(("generation", text))
    def show_phases(self, event): self.calls.append(("phases", event))
    def show_residency(self, rows): self.calls.append(("residency", rows))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls if kind != "dropped"]


def staging(t: float, target: str = "vae") -> StagingEvent:
    return StagingEvent(t=t, target=target, direction="h2d", nbytes=64 * 2**20, seconds=0.01)


def step(n: int, total: int = 4) -> StepTiming:
    return StepTiming(t=10.0 + n, request_id=7, step=n, total_steps=total, wall_s=0.5, stall_s=0.1)


def make(on_cpu: bool = False, ready: bool = True) -> tuple[EventRouter, RecordingView, Clock]:
    clock = Clock()
    router = EventRouter(on_cpu=on_cpu, history=3, clock=clock)
    view = RecordingView(ready)
    router.start_load(view)
    return router, view, clock


def test_forced_flush_draws_every_queued_event_once_and_residency_after_the_log():
    router, view, _ = make()
    router.route([ResidencySnapshot(rows=(("vae", "device", 64 * 2**20),))], loading=False)  # the engine's rows
    events = [staging(1.0), staging(2.0, "text_encoder"), step(1), step(2)]
    routed = router.route(events, loading=False, dropped=3)
    assert routed.count == 4 and view.kinds() == []  # nothing drawn before a flush
    assert ("dropped", 3) in view.calls
    router.flush(busy=False, force=True)
    drawn = dict((k, v) for k, v in view.calls if k in ("log", "steps", "progress"))
    assert [e.target for e in drawn["log"]] == ["vae", "text_encoder"]
    assert [s.step for s in drawn["steps"]] == [1, 2]
    assert drawn["progress"].step == 2
    [generation] = [v for k, v in view.calls if k == "generation"]
    assert str(generation).startswith("request 7: step 2/4 · ")
    assert view.kinds().index("residency") > view.kinds().index("log")
    assert not router.has_pending()


def test_an_unforced_tick_redraws_one_heavy_group_then_waits_for_the_interval():
    router, view, clock = make()
    router.route([staging(1.0), step(1)], loading=False)
    router.flush(busy=False)
    assert [k for k in view.kinds() if k in ("log", "steps")] == ["log"]  # one group per tick
    router.route([staging(2.0)], loading=False)
    router.flush(busy=False)
    assert [k for k in view.kinds() if k in ("log", "steps")] == ["log", "steps"]  # the log was drawn just now
    router.flush(busy=False)
    assert [k for k in view.kinds() if k in ("log", "steps")] == ["log", "steps"]
    clock.now += HEAVY_UI_S
    router.flush(busy=False)
    assert [k for k in view.kinds() if k in ("log", "steps")] == ["log", "steps", "log"]


def test_while_a_request_runs_heavy_groups_wait_longer_and_light_ones_follow_their_own_pace():
    router, view, clock = make()
    router.route([staging(1.0)], loading=False)
    router.flush(busy=True)
    router.route([staging(2.0)], loading=False)
    clock.now += HEAVY_UI_S
    router.flush(busy=True)
    assert [k for k in view.kinds() if k == "log"] == ["log"]  # HEAVY_UI_S is not enough while busy
    clock.now += HEAVY_UI_BUSY_S - HEAVY_UI_S
    router.flush(busy=True)
    assert [k for k in view.kinds() if k == "log"] == ["log", "log"]
    router.route([RequestStarted(t=3.0, request_id=9, prompt="a cube", steps=2, height=8, width=8, seed=0)],
                 loading=False)
    router.flush(busy=True)
    assert ("generation", "request 9: 'a cube' · started") not in view.calls  # drawn LIGHT_UI_S after the last
    clock.now += LIGHT_UI_S
    router.flush(busy=True)
    assert ("generation", "request 9: 'a cube' · started") in view.calls
    assert router.request_id == 9


def test_telemetry_is_kept_in_history_and_queued_only_once_the_screen_replayed_it():
    router, view, _ = make(ready=False)
    samples = [TelemetrySnapshot(t=float(i)) for i in range(5)]
    routed = router.route([TelemetryEvent(t=s.t, snapshot=s) for s in samples[:2]], loading=False)
    assert routed.telemetry and router.snapshot is samples[1]
    router.flush(busy=False, force=True)
    assert "snapshots" not in view.kinds()  # the screen replays the history itself when shown
    view.telemetry_ready = True
    router.route([TelemetryEvent(t=s.t, snapshot=s) for s in samples[2:]], loading=False)
    router.flush(busy=False, force=True)
    assert [v for k, v in view.calls if k == "snapshots"] == [samples[2:]]
    assert list(router.telemetry_history) == samples[2:]  # bounded by `history`


def test_loading_rows_go_to_the_plan_screen_with_times_from_the_first_event():
    router, _, _ = make()
    events = [EngineStateChanged(t=50.0, old="idle", new="loading"),
              LoadProgress(t=50.5, component="vae", done_bytes=10, total_bytes=20),
              LoadProgress(t=51.0, component="vae", done_bytes=20, total_bytes=20)]
    routed = router.route(events, loading=True)
    assert routed.state_changed
    assert routed.load_progress["vae"].done_bytes == 20  # the newest per component
    assert routed.load_lines[0].startswith("+    0.000s STATE idle → loading")
    assert routed.load_lines[1].startswith("+    1.000s LOAD vae")
    assert router.route(events, loading=False).load_lines == []


def test_bandwidth_is_observed_on_a_gpu_only():
    gpu, _, _ = make(on_cpu=False)
    cpu, _, _ = make(on_cpu=True)
    for router in (gpu, cpu):
        router.route([staging(1.0), staging(2.0)], loading=False)
    assert gpu.observed.rate == 64 * 2**20 / 0.01
    assert cpu.observed.rate is None


def test_a_detached_screen_gets_nothing_and_a_new_load_starts_clean():
    router, view, _ = make()
    router.route([staging(1.0), step(1)], loading=False)
    router.detach()
    router.flush(busy=False, force=True)
    assert view.kinds() == []
    fresh = RecordingView()
    router.start_load(fresh)
    router.route([RequestFinished(t=2.0, request_id=3, seconds=1.0, ok=False, error="boom")], loading=False)
    router.flush(busy=False, force=True)
    assert [k for k in fresh.kinds() if k in ("log", "steps")] == []  # the old screen's queue was dropped
    assert ("generation", "request 3 failed: boom") in fresh.calls


def test_the_engines_plan_and_state_are_handed_over_in_order_and_a_ranks_are_not():
    router, view, _ = make()
    mine = PlanReady(plan="the plan", steps=28)
    events = [EngineStateChanged(old="discovered", new="loading"), PlanReady(plan="rank 1's", rank=1), mine,
              EngineStateChanged(old="loading", new="ready", rank=0), EngineStateChanged(old="loading", new="ready")]
    routed = router.route(events, loading=True)
    assert routed.engine == [events[0], mine, events[4]]  # for the session: this process's engine only
    assert routed.state_changed  # the live status line is redrawn for a rank's change too, as before
    assert [line.split()[-1] for line in routed.load_lines] == ["loading", "ready", "ready"]  # no line of its own
    router.flush(busy=False, force=True)
    assert view.kinds() == []  # nothing for the live screen
