"""What the chosen policy costs, before anything loads: device and host bytes, transfer time, fit.

Every figure comes from the plan's forecast (safetensors headers); the transfer time uses the
device's measured host→device bandwidth and the fit uses live free device memory.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ...engine.api import Plan, RequestForecast, plain, planner
from ...offload.units import STREAMED_NAME, format_bytes, format_rate, format_seconds
from ..plan_context import LinkInfo
from ..theme_colors import follow_theme, resolve, widget_variables

NO_LINK = "no device link (CPU)"
HOST_MEMORY_KEY = "pinned host memory"
HOST_MEMORY_ON_CPU = "host memory (not pinned: CPU)"
SHORT_STYLE = "bold $error"
"""A "NO" verdict (the plan does not fit), in the active theme's error colour."""

__all__ = ["FORECASTING", "ForecastPanel", "LinkInfo", "forecast_rows"]


FORECASTING = "forecasting…"
"""The peak's value while the engine thread computes the request forecast (it reads the profile cache)."""


def forecast_rows(plan: Plan, link: LinkInfo, request: RequestForecast | None = None,
                  forecasting: bool = False, cache: Any = None) -> list[tuple[str, str, str]]:
    """(label, value, note) rows, in display order. With a request forecast whose figures were measured
    (cached, or estimated from another size), the peak counts activations and the step time replaces
    the transfer time; otherwise both are the weights-only figures. `forecasting`: the request forecast
    is on its way from the engine thread (the peak says so until it arrives)."""
    f = plan.forecast
    r = plan.forward[1]  # one forward's blocks: with two experts, the running one's
    each = " per expert, one expert on the device at a time" if plan.experts else ""
    placed = (f"{r.num_resident} resident ({r.placement}){each}, {slots_text(f.streaming_slots)}"
              if f.num_streamed_blocks else "")
    weights_peak = (f"resident + {slots_text(f.streaming_slots)} × largest streamed block "
                    f"({format_bytes(f.largest_streamed_block_bytes)}) "
                    f"+ largest staged component ({format_bytes(f.largest_staged_bytes)})")
    process = request.process_peak_bytes if request is not None and link.is_cuda else None
    if request is not None and request.peak_source != "unknown" and process is not None:
        peak_row = ("device memory of the process", format_bytes(process),
                    f"{request.peak_phase.replace('_', ' ')} at {request.size.label()} ({request.peak_label}): "
                    f"torch allocated {format_bytes(request.peak_bytes)} + CUDA context and margin "
                    f"{format_bytes(process - request.peak_bytes)}; "
                    f"weights alone {format_bytes(f.peak_device_weight_bytes)}")
    elif request is not None and request.peak_source != "unknown":
        peak_row = ("device peak", format_bytes(request.peak_bytes),
                    f"{request.peak_phase.replace('_', ' ')} with activations at {request.size.label()} "
                    f"({request.peak_label}); weights alone {format_bytes(f.peak_device_weight_bytes)}")
    elif forecasting:
        peak_row = ("device peak", FORECASTING, f"with activations, from the engine thread; weights alone "
                    f"{format_bytes(f.peak_device_weight_bytes)}")
    else:
        peak_row = ("device peak weights", format_bytes(f.peak_device_weight_bytes), weights_peak)
    rows = [
        ("device resident weights", format_bytes(f.device_resident_bytes),
         f"resident components + {plan.model.block_kind} non-block modules + resident {plan.model.block_kind} layers"
         + (" (of the running expert only)" if plan.experts else "")),
        peak_row,
        host_memory_row(plan, link),
        *host_peak_rows(request),
        (STREAMED_NAME.format(kind=plan.model.block_kind), format_bytes(f.streamed_bytes_per_forward),
         f"weights of {f.num_streamed_blocks} {plan.model.block_kind} blocks; the copies add layout padding "
         f"({f.num_resident_blocks} resident{'; ' + placed if placed else ''})"),
    ]
    for lean in request.lean if request is not None else ():  # lean phases in effect (engine/planning/lean.py)
        rows.append((lean.label, lean.peak_text.removeprefix("peak "), lean.note))
    if plan.stream_dtype is not None:  # fp8 storage: the byte figures above are at it
        kind = plan.model.block_kind
        rows.append((f"{kind} weights stored in", plan.stream_dtype,
                     planner.storage_note(plan.stream_dtype, plan.policy.fp8_modulation, kind) or ""))
        if plan.residency.num_upcast:  # resident blocks kept in the compute dtype (--upcast-resident)
            extra = sum(b.device_bytes - b.nbytes for b in plan.blocks if b.kept_upcast)
            rows.append(("kept upcast", f"{plan.residency.num_upcast} of {plan.residency.num_resident}",
                         f"resident {kind} blocks in the compute dtype: +{format_bytes(extra)}, no upcast per forward"))
    if request is not None and request.step_s is not None:
        floor = f"; floor {format_seconds(request.floor_s)}" if request.floor_s is not None else ""
        rows.append(("step time", format_seconds(request.step_s),
                     f"{request.step_label}: copy schedule replayed over "
                     f"{'measured' if request.step_source == 'cached' else 'estimated'} block times{floor}"))
    elif not link.is_cuda:
        rows.append(("transfer time per step", NO_LINK, "bandwidth applies to a GPU only"))
    elif link.bandwidth is None:
        rows.append(("transfer time per step", "measuring…", "host→device bandwidth not known yet"))
    else:
        rows.append(("transfer time per step", format_seconds(f.transfer_seconds(link.bandwidth)),
                     f"at {format_rate(link.bandwidth)} host→device ({link.bandwidth_source})"))
    if cache is not None:  # --cache (or `s`): the step as a range, never one figure
        rows.append(cache_row(plan, cache, request))
    rows.append(fits_row(plan, link, request))
    return rows


def cache_row(plan: Plan, cache: Any, request: RequestForecast | None) -> tuple[str, str, str]:
    """The step from no hits down to the kind's best case (engine/running/cache_range.py), said to be a range."""
    found = planner.cache_step_range(cache, plan.model.num_dit_blocks, request.step_s if request is not None else None)
    if found.no_hits_s is not None and found.best_s is not None:
        value = f"{format_seconds(found.best_s)} – {format_seconds(found.no_hits_s)}"
    else:
        value = "a range"
    return (f"step with cache {cache.kind}", value, found.line.split(": ", 1)[1])


def slots_text(slots: int) -> str:
    """The streamer's ring the peak counts: the policy's k slots, never more than the streamed blocks."""
    return "1 slot" if slots == 1 else f"{slots} slots"


def host_memory_row(plan: Plan, link: LinkInfo) -> tuple[str, str, str]:
    """Pinned (page-locked) memory exists only for a GPU link; on a CPU the copies are plain host memory.
    A live-re-plan load (the console's) keeps every block and encoder/VAE, whatever the policy."""
    f = plan.forecast
    live = link.live_replan and plan.policy.mode == "dlo"
    held = format_bytes(f.pinned_host_bytes_live if live else f.pinned_host_bytes)
    what = (f"every {plan.model.block_kind} block and encoder/VAE, so policy changes after load read no disk "
            f"(`run` keeps {format_bytes(f.pinned_host_bytes)})") if live else \
        "streamed blocks + staged components"
    if not link.is_cuda:
        return (HOST_MEMORY_ON_CPU, held, f"one host copy of {what}")
    return ("pinned host memory", held, f"one pinned copy of {what}")


def host_peak_rows(request: RequestForecast | None) -> list[tuple[str, str, str]]:
    """The process's host memory (RSS) at its peak phase, next to the device's (engine/planning/host_forecast.py)."""
    host = request.host if request is not None else None
    if host is None:
        return []
    source = "learned from a request" if host.baseline_source == "cached" else "default baseline"
    parts = ", ".join(f"{p.name} {format_bytes(p.nbytes)}" for p in host.parts
                      if host.peak_phase in p.phases and p.name != "process baseline")
    return [("host peak RSS", format_bytes(host.peak_bytes),
             f"{host.peak_phase.replace('_', ' ')} ({source}): process {format_bytes(host.part('process baseline'))}"
             + (f" + {parts}" if parts else "") + "; pinned pages included, page cache excluded")]


def fits_row(plan: Plan, link: LinkInfo, request: RequestForecast | None = None) -> tuple[str, str, str]:
    measured = request is not None and request.peak_source != "unknown"
    peak = request.peak_bytes if request is not None and measured else plan.forecast.peak_device_weight_bytes
    if not link.is_cuda:
        return ("fits in device free memory", "n/a (CPU)", "no device memory: weights stay in host RAM")
    if link.free_bytes is None:
        return ("fits in device free memory", "unknown", "free device memory not reported")
    free = link.free_bytes
    if peak <= free:
        verdict = f"yes ({format_bytes(free - peak)} to spare)"
    else:
        verdict = f"NO (short by {format_bytes(peak - free)})"
    return ("fits in device free memory", verdict,
            f"peak {'with activations' if measured else 'weights'} {format_bytes(peak)} vs {format_bytes(free)} "
            f"free ({link.free_source}){'' if measured else '; activations need more'}")


class ForecastPanel(Static, can_focus=True):
    """The forecast table; `show(plan, link)` re-renders it and keeps the rows for tests.

    `rows` is keyed by the GPU label, whatever the device: the host-memory row is shown as
    HOST_MEMORY_ON_CPU on a CPU but kept under HOST_MEMORY_KEY, so readers need not know the device.
    """

    DEFAULT_CSS = """
    ForecastPanel { height: auto; border: round $success; padding: 0 1; }
    """

    COMPACT_BELOW = 110
    """Narrower than this (an 80-column terminal), the notes are left out so each row is one line and
    the whole forecast fits on a 24-line screen under the component table; wider, each row has its note."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.border_title = "forecast (weights, from safetensors headers; GB = 10^9 bytes)"
        self.rows: dict[str, str] = {}
        self._shown: list[tuple[str, str, str]] = []
        self._compact: bool | None = None

    @property
    def compact(self) -> bool:
        width = self.size.width or (self.app.size.width if self.is_attached else 0)
        return 0 < width < self.COMPACT_BELOW

    def show(self, plan: Plan, link: LinkInfo, request: RequestForecast | None = None, forecasting: bool = False,
             cache: Any = None) -> None:
        rows = forecast_rows(plan, link, request, forecasting, cache)
        self.rows = {HOST_MEMORY_KEY if label == HOST_MEMORY_ON_CPU else label: value for label, value, _ in rows}
        self._shown = rows
        self._draw()

    def on_mount(self) -> None:
        follow_theme(self, self._redraw)

    def _redraw(self) -> None:
        if self._shown:
            self._draw()

    def on_resize(self) -> None:
        if self.compact != self._compact:
            self._draw()

    def _draw(self) -> None:
        compact = self._compact = self.compact
        self.border_title = ("forecast (weights; GB = 10^9 bytes; notes on a wider terminal)" if compact
                             else "forecast (weights, from safetensors headers; GB = 10^9 bytes)")
        table = Table.grid(padding=(0, 2))
        table.add_column(no_wrap=True, style="bold")
        table.add_column(justify="right", no_wrap=not compact, overflow="fold")
        if not compact:
            table.add_column(style="dim", overflow="fold")
        short = resolve(SHORT_STYLE, widget_variables(self))
        for label, value, note in self._shown:
            cell = Text(plain(value), style=short if value.startswith("NO") else "")
            if compact:
                table.add_row(Text(plain(label)), cell)
            else:  # notes may name a cached profile's path: text, never markup
                table.add_row(Text(plain(label)), cell, Text(plain(note)))
        self.update(table)
