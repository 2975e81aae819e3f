"""EventRouter with a multi-GPU group's rank-tagged events: per-rank state, no duplicates, one heavy group."""

from __future__ import annotations

import pytest
from test_event_router import Clock, RecordingView, staging

from omni_console.console.event_router import HEAVY_UI_S, EventRouter
from omni_console.engine.events import LoadProgress, RequestFinished, RequestStarted, StepTiming
from omni_console.offload.events import StagingEvent, TelemetryEvent
from omni_console.offload.telemetry import TelemetrySnapshot, TorchMemory

GB = 10**9


class RankView(RecordingView):
    """The recorder plus the GPU group panel's entry point (what it was shown, copied at the call)."""

    def show_ranks(self, ranks):
        self.calls.append(("ranks", {r: (s.step, s.wall_s, s.snapshot) for r, s in ranks.items()}))


def make() -> tuple[EventRouter, RankView, Clock]:
    clock = Clock()
    router = EventRouter(on_cpu=False, history=10, clock=clock)
    view = RankView()
    router.start_load(view)
    return router, view, clock


def sample(t: float, allocated: int) -> TelemetrySnapshot:
    return TelemetrySnapshot(t=t, torch=TorchMemory(allocated=allocated, reserved=allocated + GB))


def step(n: int, rank: int | None, wall: float = 0.5, stall: float = 0.1, request: int = 7) -> StepTiming:
    return StepTiming(t=10.0 + n, request_id=request, step=n, total_steps=4, wall_s=wall, stall_s=stall, rank=rank)


def started(rank: int | None, request: int = 7) -> RequestStarted:
    return RequestStarted(t=1.0, request_id=request, prompt="a cube", steps=4, height=8, width=8, seed=0, rank=rank)


def test_a_ranks_telemetry_is_kept_per_rank_and_never_reaches_the_memory_panels():
    router, view, _ = make()
    own, gpu0, gpu1 = sample(1.0, 1 * GB), sample(1.1, 12 * GB), sample(1.2, 30 * GB)
    routed = router.route([TelemetryEvent(t=1.1, snapshot=gpu0, rank=0),
                           TelemetryEvent(t=1.2, snapshot=gpu1, rank=1)], loading=False)
    assert not routed.telemetry  # the plan screen's header reads the console's own sample only
    assert router.snapshot is None and list(router.telemetry_history) == []
    assert router.ranks[0].snapshot is gpu0 and router.ranks[1].snapshot is gpu1
    router.route([TelemetryEvent(t=1.0, snapshot=own)], loading=False)
    assert router.snapshot is own and list(router.telemetry_history) == [own]
    router.flush(busy=False, force=True)
    [shown] = [v for k, v in view.calls if k == "snapshots"]
    assert shown == [own]  # the panels got the console's sample, not the ranks'
    [ranks] = [v for k, v in view.calls if k == "ranks"]
    assert ranks[0][2] is gpu0 and ranks[1][2] is gpu1
    assert not router.has_pending()


def test_every_ranks_steps_feed_its_stats_but_only_rank_0_feeds_the_step_table():
    router, view, _ = make()
    router.route([started(0), started(1)], loading=False)
    router.route([step(1, 0, wall=0.25, stall=0.01), step(1, 1, wall=0.40, stall=0.20),
                  step(2, 0, wall=0.35, stall=0.03), step(2, 1, wall=0.60, stall=0.10)], loading=False)
    router.flush(busy=False, force=True)
    [table] = [v for k, v in view.calls if k == "steps"]
    assert [(s.step, s.rank) for s in table] == [(1, 0), (2, 0)]
    [progress] = [v for k, v in view.calls if k == "progress"]
    assert progress.rank == 0 and progress.step == 2
    gpu0, gpu1 = router.ranks[0], router.ranks[1]
    assert (gpu0.step, gpu0.total_steps, gpu0.wall_s, gpu0.stall_s) == (2, 4, 0.35, 0.03)
    assert gpu0.mean_wall_s == pytest.approx(0.30) and gpu0.mean_stall_s == pytest.approx(0.02)
    assert gpu1.mean_wall_s == pytest.approx(0.50) and gpu1.mean_stall_s == pytest.approx(0.15)
    [ranks] = [v for k, v in view.calls if k == "ranks"]
    assert ranks[1][:2] == (2, 0.60)


def test_a_new_request_starts_each_ranks_means_over():
    router, _, _ = make()
    router.route([started(1, request=7), step(1, 1, wall=2.0), step(2, 1, wall=4.0)], loading=False)
    assert router.ranks[1].mean_wall_s == pytest.approx(3.0)
    router.route([started(1, request=8)], loading=False)
    assert router.ranks[1].step is None and router.ranks[1].mean_wall_s is None
    router.route([step(1, 1, wall=0.5, request=8)], loading=False)
    assert router.ranks[1].mean_wall_s == pytest.approx(0.5) and router.ranks[1].steps_seen == 1


def test_the_request_line_is_driven_once_not_once_per_rank():
    router, view, clock = make()
    router.route([started(0), started(1), started(2)], loading=False)
    router.flush(busy=False, force=True)
    assert [v for k, v in view.calls if k == "generation"] == ["request 7: 'a cube' · started"]
    assert router.request_id == 7
    clock.now += 10
    failed = [RequestFinished(t=2.0, request_id=7, seconds=1.0, ok=False, error=f"boom on {r}", rank=r)
              for r in (1, 0, 2)]
    router.route(failed, loading=False)
    router.flush(busy=False, force=True)
    assert [v for k, v in view.calls if k == "generation"][1:] == ["request 7 failed: boom on 0"]


def test_only_rank_0_and_this_process_report_load_progress_and_every_ranks_staging_reaches_the_log():
    router, view, _ = make()
    events = [LoadProgress(t=50.0, component="vae", done_bytes=20, total_bytes=20, rank=r) for r in (None, 0, 1)]
    events += [StagingEvent(t=51.0, target="vae", direction="h2d", nbytes=2**20, seconds=0.01, rank=1)]
    routed = router.route(events, loading=True)
    assert routed.load_progress["vae"].rank == 0  # the newest of rank None / 0; rank 1's is a duplicate
    loads = [line for line in routed.load_lines if "LOAD vae" in line]
    assert len(loads) == 2 and loads[1].startswith("r0 ")
    assert any(line.startswith("r1 ") and "vae" in line for line in routed.load_lines)  # its copy, said as rank 1's
    router.flush(busy=False, force=True)
    [log] = [v for k, v in view.calls if k == "log"]
    assert [e.rank for e in log] == [1]


def test_the_group_panel_is_one_heavy_group_paced_like_the_others():
    router, view, clock = make()
    router.route([staging(1.0), TelemetryEvent(t=1.0, snapshot=sample(1.0, GB), rank=1)], loading=False)
    router.flush(busy=False)
    assert [k for k in view.kinds() if k in ("log", "ranks")] == ["log"]  # one heavy group per tick
    router.flush(busy=False)
    assert [k for k in view.kinds() if k in ("log", "ranks")] == ["log", "ranks"]  # the next most overdue
    router.route([TelemetryEvent(t=1.2, snapshot=sample(1.2, GB), rank=1)], loading=False)
    router.flush(busy=False)
    assert [k for k in view.kinds() if k == "ranks"] == ["ranks"]  # drawn just now: waits its interval
    clock.now += HEAVY_UI_S
    router.flush(busy=False)
    assert [k for k in view.kinds() if k == "ranks"] == ["ranks", "ranks"]


def test_a_single_engine_never_draws_the_group_panel():
    router, view, _ = make()
    router.route([started(None), step(1, None), TelemetryEvent(t=1.0, snapshot=sample(1.0, GB))], loading=False)
    router.flush(busy=False, force=True)
    assert router.ranks == {} and "ranks" not in view.kinds()
    assert [s.step for s in next(v for k, v in view.calls if k == "steps")] == [1]


def test_a_new_load_forgets_the_last_groups_ranks():
    router, view, _ = make()
    router.route([TelemetryEvent(t=1.0, snapshot=sample(1.0, GB), rank=3)], loading=False)
    router.flush(busy=False, force=True)
    assert "ranks" in view.kinds() and 3 in router.ranks
    again = RankView()
    router.start_load(again)  # the ranks of a group are started by its load
    assert router.ranks == {} and not router.has_pending()
    router.route([TelemetryEvent(t=2.0, snapshot=sample(2.0, GB), rank=0)], loading=True)
    router.flush(busy=False, force=True)
    [ranks] = [v for k, v in again.calls if k == "ranks"]
    assert list(ranks) == [0]
