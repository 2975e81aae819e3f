"""Headless progress keeps running totals, not every event: bounded memory, exact report totals."""

from __future__ import annotations

import math
import random

import pytest

from omni_console.console.event_text import progress_line
from omni_console.console.run_progress import engine_line
from omni_console.console.theme_colors import resolve_default
from omni_console.engine.service.event_drain import EventDrain
from omni_console.engine.service.run_totals import KEEP_CACHE_DECISIONS, KEEP_LOG_LINES, RunTotals
from omni_console.offload.events import (
    CacheDecision,
    ErrorEvent,
    EventBus,
    LogEvent,
    OomRetry,
    StagingEvent,
    TelemetryEvent,
)
from omni_console.offload.telemetry import HostMemory, NvmlMemory, TelemetrySnapshot, TorchMemory

N = 100_000
TARGETS = ["transformer_blocks.3", "vae", "single_transformer_blocks.0"]


def _events(seed: int = 0) -> list:
    rng = random.Random(seed)
    events = []
    for i in range(N):
        kind = i % 10
        if kind < 5:
            events.append(StagingEvent(target=rng.choice(TARGETS),
                                       direction=rng.choice(["h2d", "h2d", "d2h"]), nbytes=rng.randrange(1, 1 << 30),
                                       seconds=rng.random() / 100, sync=rng.random() < 0.1))
        elif kind < 8:
            host = HostMemory(rss=rng.randrange(1 << 34), pinned_bytes=rng.choice([None, rng.randrange(1 << 33)]))
            events.append(TelemetryEvent(snapshot=TelemetrySnapshot(
                t=float(i), torch=TorchMemory(reserved=rng.randrange(1 << 35)), nvml=NvmlMemory(), host=host)))
        elif kind == 8:
            events.append(CacheDecision(action=rng.choice(["retain", "release"]), reason=f"r{i}"))
        else:
            events.append(LogEvent(level="info", message=f"line {i}"))
    return events


@pytest.mark.slow
def test_progress_memory_is_bounded_and_totals_exact():
    events = _events()
    bus = EventBus()
    progress = EventDrain(bus.subscribe(), engine_line)  # `run`'s progress thread, each event made a line
    progress.start()
    for event in events:
        bus.publish(event)
    progress.finish()
    assert progress.sub.dropped == 0
    totals = progress.totals
    assert totals.stored_items() <= KEEP_CACHE_DECISIONS + KEEP_LOG_LINES  # not ~100 000 events
    assert not hasattr(progress, "events")

    h2d = [e for e in events if isinstance(e, StagingEvent) and e.direction == "h2d"]
    summary = totals.summary()
    assert summary["staging"]["h2d_transfers"] == len(h2d)
    assert summary["staging"]["h2d_bytes"] == sum(e.nbytes for e in h2d)
    # float seconds: Python 3.12's sum() compensates rounding, a running total does not
    assert summary["staging"]["h2d_seconds"] == pytest.approx(math.fsum(e.seconds for e in h2d), rel=1e-9)
    assert summary["staging"]["sync_transfers"] == sum(e.sync for e in h2d)
    blocks = sum(1 for e in h2d if e.target != "vae")
    assert summary["staging"]["by_target_kind"] == {"block": blocks, "component": len(h2d) - blocks}
    decisions = [e for e in events if isinstance(e, CacheDecision)]
    assert summary["cache_decisions_total"] == len(decisions)
    assert summary["cache_releases"] == sum(d.action == "release" for d in decisions)
    assert [d["reason"] for d in summary["cache_decisions"]] == [d.reason for d in decisions[-KEEP_CACHE_DECISIONS:]]
    logs = [e.message for e in events if isinstance(e, LogEvent)]
    assert summary["log_lines_total"] == len(logs) and summary["log"] == logs[-KEEP_LOG_LINES:]

    snaps = [e.snapshot for e in events if isinstance(e, TelemetryEvent)]
    peaks = totals.telemetry_peaks()
    assert peaks["samples"] == len(snaps)
    assert peaks["torch_reserved_peak"] == max(s.torch.reserved for s in snaps)
    assert peaks["host_rss_peak"] == max(s.host.rss for s in snaps)
    assert peaks["pinned_peak"] == max(s.host.pinned_bytes for s in snaps if s.host.pinned_bytes is not None)
    assert peaks["nvml_used_peak"] is None  # never available: stays unknown, not 0


def test_empty_run_reports_no_bandwidth():
    summary = RunTotals().summary()
    assert summary["staging"]["h2d_bytes_per_s"] is None and summary["cache_decisions"] == []


def test_error_and_oom_events_print_as_sentences_not_reprs():
    text, style = progress_line(ErrorEvent(where="load", message="RuntimeError: pinning failed\nmore detail"))
    assert text == "load failed: RuntimeError: pinning failed"
    assert style == resolve_default("$error")  # the default theme's error colour (test_theme_colours checks it)
    text, _ = progress_line(OomRetry(component="vae", nbytes=2_000_000, attempt=1, message="CUDA out of memory"))
    assert text.startswith("out of device memory loading vae (2") and "retrying once" in text
    assert "OomRetry(" not in text
