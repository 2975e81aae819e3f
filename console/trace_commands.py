"""`e` (live screen, plot screen): the request's Chrome/Perfetto trace, written in the output folder.

Part of `OmniConsoleApp` (a mixin). The trace is built from the events the console received
(`RequestRecord`, engine/running/trace_events.py) and saved under a new name beside the images,
`...-request-N-trace.json`: never over a file that exists (console/outputs.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.errors import OPERATOR_ERRORS
from .event_text import one_line
from .outputs import save_trace

if TYPE_CHECKING:
    from pathlib import Path

    from .event_router import EventRouter

TRACE_HINT = "open it in ui.perfetto.dev or chrome://tracing"


class TraceCommands:
    router: EventRouter
    out_dir: Path

    def action_write_trace(self) -> None:
        record = self.router.record
        if record.started is None:
            self.say("no request yet: nothing to trace", "warning", timeout=3)  # type: ignore[attr-defined]
            return
        try:
            path = save_trace(record.trace(), self.out_dir, record.started.request_id)
        except (OSError, *OPERATOR_ERRORS) as exc:
            self.say(f"trace not written: {one_line(str(exc))}", "error")  # type: ignore[attr-defined]
            return
        running = "" if record.finished is not None else " (so far: the request is still running)"
        self.say(f"trace of request {record.started.request_id}{running}: {path} — {TRACE_HINT}")  # type: ignore[attr-defined]
