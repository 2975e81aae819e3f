"""Host memory panel: process RSS, engine-held pinned bytes, RAM total/available, and where the streamed
bytes come from when a page-cache or disk tier is in use (bytes per tier, read rates: console/tier_traffic.py).

Pinned pages often do not show in RSS, and a container's cgroup limit can be far below the
machine's RAM, so both are shown explicitly.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from omni_console.console.telemetry_text import LABELS, UNITS_NOTE, format_unavailable, host_readings
from omni_console.engine.api import TelemetrySnapshot
from omni_console.offload.units import format_bytes

from .metric_row import HISTORY_SAMPLES, MetricRow
from .text_update import set_text

HOST_KEYS = ("host.rss", "host.pinned", "host.total", "host.available")


def _row_id(key: str) -> str:
    return "m-" + key.replace(".", "-")


class HostPanel(Vertical, can_focus=True):
    """Host RAM rows with history; "unavailable: <reason>" when psutil cannot say."""

    DEFAULT_CSS = """
    HostPanel { height: auto; border: round $secondary; padding: 0 1; }
    HostPanel > .unavailable { color: $warning; height: auto; }
    HostPanel > .notes { color: $text-muted; height: auto; }
    HostPanel > #host-tiers { height: auto; }
    """

    def __init__(
        self, *, history: int = HISTORY_SAMPLES, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(id=id, classes=classes)
        self._history = history
        self.border_title = f"host memory ({UNITS_NOTE})"
        self.snapshot: TelemetrySnapshot | None = None
        self.tier_lines: list[str] = []

    def compose(self) -> ComposeResult:
        yield Static(
            "unavailable: no telemetry yet", id="host-unavailable", classes="unavailable", markup=False
        )
        for key in HOST_KEYS:
            yield MetricRow(key, LABELS[key], history=self._history, id=_row_id(key))
        yield Static("", id="host-notes", classes="notes", markup=False)
        tiers = Static("", id="host-tiers", markup=False)
        tiers.display = False
        yield tiers

    def on_mount(self) -> None:
        if self.tier_lines:  # fed before mount (is_mounted turns True after on_mount)
            self._apply_tiers()
        if self.snapshot is not None:  # fed before mount; is_mounted turns True after on_mount
            self.call_after_refresh(self.update_snapshot, self.snapshot)
        else:
            self._show("no telemetry yet")

    def show_tiers(self, lines: list[str]) -> None:
        """The host tiers' lines (none: hidden, every byte pinned)."""
        self.tier_lines = lines
        if self.is_mounted:
            self._apply_tiers()

    def _apply_tiers(self) -> None:
        box = self.query_one("#host-tiers", Static)
        set_text(box, "\n".join(self.tier_lines))
        box.display = bool(self.tier_lines)

    def row(self, key: str) -> MetricRow:
        return self.query_one("#" + _row_id(key), MetricRow)

    def _show(self, unavailable: str | None) -> None:
        banner = self.query_one("#host-unavailable", Static)
        banner.display = unavailable is not None
        if unavailable is not None:
            set_text(banner, format_unavailable(unavailable))
        for key in HOST_KEYS:
            self.row(key).display = unavailable is None
        if unavailable is not None:
            self.query_one("#host-notes", Static).display = False

    def update_snapshots(self, snapshots: list[TelemetrySnapshot]) -> None:
        """Replay many samples at once (history first, one redraw for the newest)."""
        if not snapshots:
            return
        if self.is_mounted:
            readings = [host_readings(s.host) for s in snapshots[:-1]]
            for i, key in enumerate(HOST_KEYS):
                self.row(key).extend([rows[i].value for rows in readings])
        self.update_snapshot(snapshots[-1])

    def update_snapshot(self, snapshot: TelemetrySnapshot) -> None:
        """Show the host group of one telemetry sample."""
        self.snapshot = snapshot
        if not self.is_mounted:
            return
        h = snapshot.host
        with self.app.batch_update():
            self._show(h.unavailable)
            if h.unavailable:
                return
            readings = host_readings(h)
            for r in readings:
                text = format_bytes(r.value) if r.value is not None else r.text  # cgroup note goes below
                self.row(r.key).push(r.value, text, r.reason)
            notes = []
            if h.cgroup_limit is not None:
                limit, host = format_bytes(h.cgroup_limit), format_bytes(h.host_total)
                notes.append(f"RAM limited by cgroup to {limit} (host has {host})")
            notes += [f"{r.label}: N/A ({r.reason})" for r in readings if r.value is None and r.reason]
            box = self.query_one("#host-notes", Static)
            set_text(box, "\n".join(notes))
            box.display = bool(notes)
