"""Writing outputs: atomic publishing, the pending files an interrupt removes, and signal deferral.

One namespace of the engine's front door (`from omni_console.engine.api import writes`); names load lazily.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports are this namespace's names, for type checkers)
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:  # the same names as `EXPORTS` (tests/engine/test_api.py holds them equal)
    from ..running.atomic_write import publish_new, remove_pending, scratch_folder
    from ..running.group_write import GroupOutput, write_results
    from ..running.output_notes import write_notes
    from ..running.outputs import DEFAULT_FPS, OutputTarget, write_result
    from ..running.pipeline_output import frame_size
    from ..running.signal_guard import (
        SignalGuard,
        SignalStop,
        completed_outputs,
        deferrable,
        forget_outputs,
        held,
        pause_point,
    )
    from ..running.trace_events import TraceRecorder, request_spans
    from ..running.trace_file import write_trace

EXPORTS: dict[str, tuple[str, ...]] = {
    "..running.outputs": ("DEFAULT_FPS", "OutputTarget", "write_result"),
    "..running.output_notes": ("write_notes",),
    "..running.group_write": ("GroupOutput", "write_results"),
    "..running.pipeline_output": ("frame_size",),
    "..running.trace_events": ("TraceRecorder", "request_spans"),
    "..running.trace_file": ("write_trace",),
    "..running.atomic_write": ("publish_new", "remove_pending", "scratch_folder"),
    "..running.signal_guard": (
        "SignalGuard", "SignalStop", "completed_outputs", "deferrable", "forget_outputs", "held", "pause_point",
    ),
}
"""Each name's module (relative to this package)."""

__getattr__, __dir__, __all__ = lazy_names(__name__, __package__, EXPORTS)
