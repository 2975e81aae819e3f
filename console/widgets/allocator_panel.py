"""GPU memory panel: torch caching allocator and NVML side by side, with the labels of console/telemetry_text.py.

Operators compare these numbers with nvidia-smi; the labels say what each one counts
(torch `reserved` is ours only, NVML `used` includes other processes and the CUDA context).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from omni_console.console.telemetry_text import (
    LABELS,
    UNITS_NOTE,
    Reading,
    format_unavailable,
    free_for_us_reading,
    nvml_readings,
    torch_readings,
)

from ...engine.api import TelemetrySnapshot, probes
from .metric_row import HISTORY_SAMPLES, MetricRow
from .text_update import set_text

TORCH_KEYS = (
    "torch.allocated",
    "torch.reserved",
    "torch.cached",
    "torch.peak",
    "torch.alloc_retries",
    "torch.free",
)
NVML_KEYS = (
    "nvml.total",
    "nvml.used",
    "nvml.free",
    "nvml.reserved",
    "nvml.pcie_rx",
    "nvml.pcie_tx",
    "nvml.gpu_util",
    "nvml.mem_util",
)


def _row_id(key: str) -> str:
    return "m-" + key.replace(".", "-").replace("_", "-")


def _notes(readings: list[Reading], group: probes.TorchMemory | probes.NvmlMemory) -> str:
    """One line listing why individual fields are N/A (the value cells only say N/A)."""
    missing = [f"{r.label.split(' (')[0]}: {r.reason}" for r in readings if r.value is None and r.reason]
    return ("N/A — " + "; ".join(missing)) if missing and not group.unavailable else ""


class AllocatorPanel(VerticalScroll):
    """torch allocator + NVML rows with ≥ 2 minutes of sparkline history each.

    Feed it with `update_snapshot(snapshot)`; a group that cannot be read shows
    "unavailable: <reason>" in place of its rows.
    """

    DEFAULT_CSS = """
    AllocatorPanel { height: auto; max-height: 100%; border: round $primary; padding: 0 1; }
    AllocatorPanel > .group-title { text-style: bold; color: $primary; height: 1; }
    AllocatorPanel > .unavailable { color: $warning; height: auto; }
    AllocatorPanel > .notes { color: $text-muted; height: auto; }
    """

    def __init__(
        self, *, history: int = HISTORY_SAMPLES, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(id=id, classes=classes)
        self._history = history
        self.border_title = f"GPU memory ({UNITS_NOTE})"
        self.snapshot: TelemetrySnapshot | None = None

    def compose(self) -> ComposeResult:
        yield Static("torch caching allocator", id="torch-title", classes="group-title", markup=False)
        yield Static(
            "unavailable: no telemetry yet", id="torch-unavailable", classes="unavailable", markup=False
        )
        for key in TORCH_KEYS:
            yield MetricRow(key, LABELS[key], history=self._history, id=_row_id(key))
        yield Static("", id="torch-notes", classes="notes", markup=False)
        yield Static("NVML", id="nvml-title", classes="group-title", markup=False)
        yield Static(
            "unavailable: no telemetry yet", id="nvml-unavailable", classes="unavailable", markup=False
        )
        for key in NVML_KEYS:
            yield MetricRow(key, LABELS[key], history=self._history, id=_row_id(key))
        yield Static("", id="nvml-notes", classes="notes", markup=False)
        yield MetricRow(
            "free_for_us", LABELS["free_for_us"], history=self._history, id=_row_id("free_for_us")
        )

    def on_mount(self) -> None:
        if self.snapshot is not None:  # fed before mount; is_mounted turns True after on_mount
            self.call_after_refresh(self.update_snapshot, self.snapshot)
        else:
            self._show_group("torch", "no telemetry yet", TORCH_KEYS)
            self._show_group("nvml", "no telemetry yet", NVML_KEYS)

    def row(self, key: str) -> MetricRow:
        """The row for a `LABELS` key (e.g. "torch.reserved"); tests read its history."""
        return self.query_one("#" + _row_id(key), MetricRow)

    def _show_group(self, name: str, unavailable: str | None, keys: tuple[str, ...]) -> None:
        banner = self.query_one(f"#{name}-unavailable", Static)
        banner.display = unavailable is not None
        if unavailable is not None:
            set_text(banner, format_unavailable(unavailable))
        for key in keys:
            self.row(key).display = unavailable is None
        if unavailable is not None:
            self.query_one(f"#{name}-notes", Static).display = False

    def update_snapshots(self, snapshots: list[TelemetrySnapshot]) -> None:
        """Replay many samples at once (history first, one redraw for the newest)."""
        if not snapshots:
            return
        if self.is_mounted:
            past = snapshots[:-1]
            readings = [torch_readings(s.torch) + nvml_readings(s.nvml) for s in past]
            for i, key in enumerate(TORCH_KEYS + NVML_KEYS):
                self.row(key).extend([rows[i].value for rows in readings])
            self.row("free_for_us").extend([free_for_us_reading(s).value for s in past])
        self.update_snapshot(snapshots[-1])

    def update_snapshot(self, snapshot: TelemetrySnapshot) -> None:
        """Show one telemetry sample and extend every history by it."""
        self.snapshot = snapshot
        if not self.is_mounted:
            return
        t, n = snapshot.torch, snapshot.nvml
        with self.app.batch_update():
            set_text(self.query_one("#torch-title", Static),
                "torch caching allocator" + (f" — {t.device_name}" if t.device_name else "")
            )
            set_text(self.query_one("#nvml-title", Static),
                "NVML" + (f" — {n.device_name}" if n.device_name else "")
            )
            self._show_group("torch", t.unavailable, TORCH_KEYS)
            self._show_group("nvml", n.unavailable, NVML_KEYS)
            torch_rows = torch_readings(t)
            nvml_rows = nvml_readings(n)
            for r in torch_rows + nvml_rows:
                alert = r.key == "torch.alloc_retries" and bool(r.value)
                self.row(r.key).push(r.value, r.text, r.reason, alert=alert)
            for name, text in (("torch", _notes(torch_rows, t)), ("nvml", _notes(nvml_rows, n))):
                notes = self.query_one(f"#{name}-notes", Static)
                set_text(notes, text)
                notes.display = bool(text)  # no blank line when every field answered
            ffu = free_for_us_reading(snapshot)
            self.row("free_for_us").push(ffu.value, ffu.text, ffu.reason)
