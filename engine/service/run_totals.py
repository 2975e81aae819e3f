"""Running totals of a headless run's events, in bounded memory.

A run publishes telemetry at up to 100 Hz and a staging event per transfer for as long as it
lasts; keeping every event would grow without limit (tens of MB an hour). The report needs only
sums, counts, peaks and the most recent cache decisions and log lines, so those are kept instead.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

from ..events import CacheDecision, Event, LogEvent, StagingEvent, TelemetryEvent

KEEP_CACHE_DECISIONS = 256
KEEP_LOG_LINES = 256

_PEAKS: dict[str, Callable[[Any], int | None]] = {
    "torch_reserved_peak": lambda s: s.torch.reserved,
    "nvml_used_peak": lambda s: s.nvml.used,
    "host_rss_peak": lambda s: s.host.rss,
    "pinned_peak": lambda s: s.host.pinned_bytes,
}


def _target_kind(target: str) -> str:
    """`transformer_blocks.3` is a streamed DiT block; anything else is a staged component."""
    return "block" if "." in target and target.split(".")[-1].isdigit() else "component"


class RunTotals:
    """Sums, counts and peaks over every event added; the last few decisions and log lines."""

    def __init__(self, keep_decisions: int = KEEP_CACHE_DECISIONS, keep_log: int = KEEP_LOG_LINES) -> None:
        self.h2d_transfers = 0
        self.h2d_bytes = 0
        self.h2d_seconds = 0.0
        self.sync_transfers = 0
        self.by_target_kind: Counter[str] = Counter()
        self.cache_decisions: deque[CacheDecision] = deque(maxlen=keep_decisions)
        self.cache_decisions_total = 0
        self.cache_releases = 0
        self.log: deque[str] = deque(maxlen=keep_log)
        self.log_lines_total = 0
        self.telemetry_samples = 0
        self.peaks: dict[str, int | None] = dict.fromkeys(_PEAKS)

    def add(self, event: Event) -> None:
        if isinstance(event, StagingEvent):
            if event.direction == "h2d":
                self.h2d_transfers += 1
                self.h2d_bytes += event.nbytes
                self.h2d_seconds += event.seconds
                self.sync_transfers += bool(event.sync)
                self.by_target_kind[_target_kind(event.target)] += 1
        elif isinstance(event, TelemetryEvent):
            self.telemetry_samples += 1
            for key, read in _PEAKS.items():
                value = read(event.snapshot)
                if value is not None and (self.peaks[key] is None or value > self.peaks[key]):
                    self.peaks[key] = value
        elif isinstance(event, CacheDecision):
            self.cache_decisions.append(event)
            self.cache_decisions_total += 1
            self.cache_releases += event.action == "release"
        elif isinstance(event, LogEvent):
            self.log.append(event.message)
            self.log_lines_total += 1

    def add_all(self, events: Iterable[Event]) -> RunTotals:
        for event in events:
            self.add(event)
        return self

    def stored_items(self) -> int:
        """How many per-event records are held (bounded by the two `keep_*` limits)."""
        return len(self.cache_decisions) + len(self.log)

    def summary(self) -> dict[str, Any]:
        """Staging totals and bandwidth, cache decisions (the most recent ones listed), log lines."""
        secs = self.h2d_seconds
        return {
            "staging": {
                "h2d_transfers": self.h2d_transfers, "h2d_bytes": self.h2d_bytes, "h2d_seconds": secs,
                "h2d_bytes_per_s": self.h2d_bytes / secs if secs > 0 else None,
                "sync_transfers": self.sync_transfers,
                "by_target_kind": dict(self.by_target_kind),
            },
            "cache_decisions": [{"action": d.action, "reason": d.reason, "forced": d.forced}
                                for d in self.cache_decisions],
            "cache_decisions_total": self.cache_decisions_total,
            "cache_releases": self.cache_releases,
            "log": list(self.log),
            "log_lines_total": self.log_lines_total,
        }

    def telemetry_peaks(self) -> dict[str, Any]:
        """Peaks over the run's telemetry samples (None where a reading was never available)."""
        return {"samples": self.telemetry_samples, **self.peaks}


def summarize(events: Iterable[Event]) -> dict[str, Any]:
    return RunTotals().add_all(events).summary()


def telemetry_peaks(events: Iterable[Event]) -> dict[str, Any]:
    return RunTotals().add_all(events).telemetry_peaks()
