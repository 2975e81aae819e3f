"""What the operator is told when a request ends: toast, the live screen's request line, event-log line.

Pure functions of the engine's result and of what saving did, so the app only shows them. A request
that ran fewer denoise steps than asked was cancelled: its image is half-denoised and not a result,
so it is not saved unless asked for (`should_save`), and every place says after how many steps.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..engine import events
from ..engine.api import service
from ..offload.units import format_seconds

Severity = Literal["information", "warning", "error"]


@dataclass(frozen=True, slots=True)
class Outcome:
    notice: str
    severity: Severity
    status: str
    """The live screen's request line."""
    log: events.Event | None = None
    """A line for the event log (failures, cancellations, save errors); None for a plain success."""


def steps_done(result: service.GenerateResult) -> tuple[int, int]:
    """(denoise steps run, steps asked for); (0, 0) when the pipeline reported no steps."""
    if not result.steps:
        return 0, 0
    return len(result.steps), result.steps[-1].total_steps


def is_partial(result: service.GenerateResult) -> bool:
    """Cancelled before its last step (the image is half-denoised), or while it was being decoded."""
    done, total = steps_done(result)
    return result.cancelled or (total > 0 and done < total)


def should_save(result: service.GenerateResult, save_partial: bool) -> bool:
    image = result.image
    made = (image is not None and hasattr(image, "save")) or (not result.frames and result.audio is not None)
    return made and (save_partial or not is_partial(result))


def cancelled(request_id: int | None, done: int, total: int) -> Outcome:
    """esc stopped the request between two blocks: nothing of it is kept (no image, no profile)."""
    where = "request" if request_id is None else f"request {request_id}"
    said = f"{where} cancelled after {done}/{total} steps; nothing saved"
    return Outcome(said, "warning", said, events.LogEvent(level="warning", message=said))


def failed(request_id: int | None, reason: str) -> Outcome:
    """The request raised (or never started): error toast, and the reason in the event log."""
    where = "request" if request_id is None else f"request {request_id}"
    return Outcome(f"request failed: {reason}", "error", f"request failed: {reason}",
                   events.ErrorEvent(where=where, message=f"failed: {reason}"))


def finished(result: service.GenerateResult, output: Path | None, save_error: str | None) -> Outcome:
    """The request returned: saved (where), not saved (why), or cancelled after k/n steps."""
    done, total = steps_done(result)
    rid = result.request_id
    what = "video" if result.is_video else "image" if result.frames or result.audio is None else "audio"
    if is_partial(result):
        if output is not None:
            where = f"partial {what} saved {output}"
        else:
            where = f"{what} not saved: {save_error}" if save_error else "nothing saved"
        said = f"request {rid} cancelled after {done}/{total} steps; {where}"
        return Outcome(said, "warning", f"{said} ({format_seconds(result.seconds)})",
                       events.LogEvent(level="warning", message=said))
    median = statistics.median(s.wall_s for s in result.steps) if result.steps else 0.0
    head = f"request {rid}: {done} steps in {format_seconds(result.seconds)} (median step {format_seconds(median)})"
    if output is not None:
        return Outcome(f"{what} saved: {output}", "information", f"{head} · saved {output}")
    if save_error:
        where = f"{what} not saved: {save_error}"
        return Outcome(where, "warning", f"{head} · {where}", events.ErrorEvent(where=f"request {rid}", message=where))
    return Outcome("no image", "information", f"{head} · no image")
