"""What the chosen policy costs, before anything loads: device and host bytes, transfer time, fit.

Every figure comes from the plan's forecast (safetensors headers); the transfer time uses the
device's measured host→device bandwidth and the fit uses live free device memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table
from textual.widgets import Static

from ...engine.plan import Plan
from ...engine.units import fmt_bytes, fmt_rate, fmt_seconds

NO_LINK = "no device link (CPU)"
HOST_MEMORY_KEY = "pinned host memory"
HOST_MEMORY_ON_CPU = "host memory (not pinned: CPU)"


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """The device side the forecast is judged against."""

    is_cuda: bool
    bandwidth: float | None = None  # bytes/s host→device
    bandwidth_source: str = ""
    free_bytes: int | None = None
    free_source: str = ""


def forecast_rows(plan: Plan, link: LinkInfo) -> list[tuple[str, str, str]]:
    """(label, value, note) rows, in display order."""
    f = plan.forecast
    rows = [
        ("device resident weights", fmt_bytes(f.device_resident_bytes),
         "resident components + DiT non-block modules + resident DiT layers"),
        ("device peak weights", fmt_bytes(f.peak_device_weight_bytes),
         f"resident + 2 slots × largest streamed block ({fmt_bytes(f.largest_streamed_block_bytes)}) "
         f"+ largest staged component ({fmt_bytes(f.largest_staged_bytes)})"),
        host_memory_row(plan, link),
        ("streamed per step", fmt_bytes(f.streamed_bytes_per_forward),
         f"{f.num_streamed_blocks} DiT blocks cross the link once per DiT forward "
         f"({f.num_resident_blocks} resident)"),
    ]
    if not link.is_cuda:
        rows.append(("transfer time per step", NO_LINK, "bandwidth applies to a GPU only"))
    elif link.bandwidth is None:
        rows.append(("transfer time per step", "measuring…", "host→device bandwidth not known yet"))
    else:
        rows.append(("transfer time per step", fmt_seconds(f.transfer_seconds(link.bandwidth)),
                     f"at {fmt_rate(link.bandwidth)} host→device ({link.bandwidth_source})"))
    rows.append(fits_row(plan, link))
    return rows


def host_memory_row(plan: Plan, link: LinkInfo) -> tuple[str, str, str]:
    """Pinned (page-locked) memory exists only for a GPU link; on a CPU the copies are plain host memory."""
    held = fmt_bytes(plan.forecast.pinned_host_bytes)
    if not link.is_cuda:
        return (HOST_MEMORY_ON_CPU, held, "one host copy of streamed blocks + staged components")
    return ("pinned host memory", held, "one pinned copy of streamed blocks + staged components")


def fits_row(plan: Plan, link: LinkInfo) -> tuple[str, str, str]:
    peak = plan.forecast.peak_device_weight_bytes
    if not link.is_cuda:
        return ("fits in device free memory", "n/a (CPU)", "no device memory: weights stay in host RAM")
    if link.free_bytes is None:
        return ("fits in device free memory", "unknown", "free device memory not reported")
    free = link.free_bytes
    verdict = f"yes ({fmt_bytes(free - peak)} to spare)" if peak <= free else f"NO (short by {fmt_bytes(peak - free)})"
    return ("fits in device free memory", verdict,
            f"peak weights {fmt_bytes(peak)} vs {fmt_bytes(free)} free ({link.free_source}); activations need more")


class ForecastPanel(Static):
    """The forecast table; `show(plan, link)` re-renders it and keeps the rows for tests.

    `rows` is keyed by the GPU label, whatever the device: the host-memory row is shown as
    HOST_MEMORY_ON_CPU on a CPU but kept under HOST_MEMORY_KEY, so readers need not know the device.
    """

    DEFAULT_CSS = """
    ForecastPanel { height: auto; border: round $success; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.border_title = "forecast (weights, from safetensors headers; GB = 10^9 bytes)"
        self.rows: dict[str, str] = {}

    def show(self, plan: Plan, link: LinkInfo) -> None:
        rows = forecast_rows(plan, link)
        self.rows = {HOST_MEMORY_KEY if label == HOST_MEMORY_ON_CPU else label: value for label, value, _ in rows}
        table = Table.grid(padding=(0, 2))
        table.add_column(no_wrap=True, style="bold")
        table.add_column(justify="right", no_wrap=True)
        table.add_column(style="dim", overflow="fold")
        for label, value, note in rows:
            style = "bold red" if value.startswith("NO") else ""
            table.add_row(label, f"[{style}]{value}[/]" if style else value, note)
        self.update(table)
