"""What the console keeps per rank of a multi-GPU group: its newest telemetry sample and its steps.

Every rank runs the same steps of its own request at once, so a slow or stalling GPU shows as one
rank whose step time or stall is out of line with the others. No Textual here: the event router
fills these, the GPU group panel reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine import events
from ..engine.api import TelemetrySnapshot


@dataclass
class RankStats:
    """One rank: the newest telemetry sample, the last step and the means over its current request."""

    rank: int
    snapshot: TelemetrySnapshot | None = None
    request_id: int | None = None
    step: int | None = None
    total_steps: int | None = None
    wall_s: float | None = None
    stall_s: float | None = None
    steps_seen: int = 0
    """Steps of the current request seen so far (what the means are over)."""
    wall_sum_s: float = 0.0
    stall_sum_s: float = 0.0

    def start_request(self, request_id: int) -> None:
        """A new request on this rank: the last step and the means start over."""
        self.request_id = request_id
        self.step = self.total_steps = self.wall_s = self.stall_s = None
        self.steps_seen = 0
        self.wall_sum_s = self.stall_sum_s = 0.0

    def add_step(self, event: events.StepTiming) -> None:
        """One step's timing; a step of another request starts that request's means."""
        if event.request_id != self.request_id:
            self.start_request(event.request_id)
        self.step, self.total_steps = event.step, event.total_steps
        self.wall_s, self.stall_s = event.wall_s, event.stall_s
        self.steps_seen += 1
        self.wall_sum_s += event.wall_s
        self.stall_sum_s += event.stall_s

    @property
    def mean_wall_s(self) -> float | None:
        return self.wall_sum_s / self.steps_seen if self.steps_seen else None

    @property
    def mean_stall_s(self) -> float | None:
        return self.stall_sum_s / self.steps_seen if self.steps_seen else None
