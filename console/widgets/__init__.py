"""Reusable console widgets. Each one is fed data by the app and never reads engine internals."""

from .allocator_panel import AllocatorPanel
from .filter_bar import FilterBar
from .host_panel import HostPanel
from .metric_row import HISTORY_SAMPLES, MetricRow
from .residency_panel import STATES, ResidencyPanel, ResidencyRow
from .staging_log import StagingLog, format_event
from .step_timings import StepTimings

__all__ = [
    "HISTORY_SAMPLES",
    "STATES",
    "AllocatorPanel",
    "FilterBar",
    "HostPanel",
    "MetricRow",
    "ResidencyPanel",
    "ResidencyRow",
    "StagingLog",
    "StepTimings",
    "format_event",
]
