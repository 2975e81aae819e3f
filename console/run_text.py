"""`run`'s report as an operator reads it on a terminal: one table of what the load and the request cost,
the last telemetry sample, then the files written (unwrapped: paths an operator copies) and the notes.
Every data string is shown as written (`plain`): a path or a name is never markup or control.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..engine.api import plain
from ..offload.units import copied_text, format_bytes, format_rate, format_seconds
from .compile_flags import compile_row
from .event_text import PHASE_LABELS
from .host_check import host_check_row


class _PlainTable(Table):
    """A table whose cells are shown as written: a path or name from data is never markup or control."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:  # type: ignore[override]
        super().add_row(*(Text(plain(r)) if isinstance(r, str) else r for r in renderables), **kwargs)


def print_report(r: dict[str, Any], console: Console, kind: str = "DiT") -> None:
    """The report as a table, the last telemetry lines, then the files written and the notes."""
    table = _PlainTable(title=Text(plain(f"run — {r['model']} on {r['device']}")), show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    on_cpu = r["device"].startswith("cpu")  # no device link: copies are host memory copies, nothing pinned
    table.add_row("load time", format_seconds(r["load_seconds"]))
    for key, seconds in r.get("load_phases", {}).items():
        table.add_row(f"  {key}", format_seconds(seconds))
    table.add_row("pinned host memory", "none (CPU)" if on_cpu else format_bytes(r["pinned_bytes"]))
    if r.get("pin_fallback_blocks"):
        table.add_row("  page cache (page-lock refused)",
                      f"{r['pin_fallback_blocks']} blocks, {format_bytes(r['pin_fallback_bytes'])}")
    table.add_row("request time", format_seconds(r["request_seconds"]))
    for key, seconds in r["phases"].items():
        table.add_row(f"  {PHASE_LABELS.get(key, key)}", format_seconds(seconds))
    if "vae_decode" in r["phases"]:
        table.add_row("  VAE decode peak (torch)", format_bytes(r["vae_decode_peak_bytes"]))
    latents = f" (latents {'x'.join(map(str, r['latent_shape']))})" if r["latent_shape"] else ""
    table.add_row("frames", f"{r['frames']}{latents}")
    if r.get("guidance") is not None:  # as `plan` shows it: the flag's, the call's default or the guider's
        table.add_row("guidance scale", f"{r['guidance']:g}")
    if r["is_video"]:
        table.add_row("frame rate", f"{r['fps']:g} fps ({r['fps_source']})")
    if r["copied_bytes_per_forward"]:  # the plan names the weights; the copies carry padding too
        table.add_row(f"copied per {kind} forward",
                      copied_text(r["copied_bytes_per_forward"], r["forecast"]["streamed_bytes_per_forward"]))
    cache = r.get("cache")
    table.add_row("steps", f"{len(r['steps'])} (each in the table below)")
    if cache:
        rate = f"{cache['hits']}/{cache['forwards']} forwards hit" if cache["forwards"] else "no block skipped"
        table.add_row(f"step cache {cache['cache']}", f"{rate}, skipped {format_bytes(cache['bytes_skipped'])}, "
                                                     f"copied {format_bytes(cache['bytes_moved'])}")
    st = r["staging"]
    if on_cpu:
        table.add_row("host copies (CPU: no device link)", f"{st['h2d_transfers']}, {format_bytes(st['h2d_bytes'])}")
    else:
        table.add_row("host→device transfers", f"{st['h2d_transfers']} ({st['sync_transfers']} synchronous)")
        table.add_row("host→device bytes", format_bytes(st["h2d_bytes"]))
        table.add_row("host→device bandwidth (mean)", format_rate(st["h2d_bytes_per_s"]))
    table.add_row("peak allocated (torch)", format_bytes(r["peak_allocated_bytes"]))
    if not on_cpu:
        table.add_row("device memory of the process (NVML peak)", format_bytes(r["process_peak_bytes"])
                      if r["process_peak_bytes"] is not None else f"N/A: {r['process_peak_note']}")
        if r.get("predicted_process_peak_bytes") is not None:
            error = r["process_peak_error"]
            table.add_row("  forecast (allocated + context + margin)",
                          format_bytes(r["predicted_process_peak_bytes"])
                          + (f" ({error * 100:+.1f}%, context {r['context_source']})" if error is not None else ""))
    if r["allocator_cap_bytes"] is not None:
        table.add_row("allocator cap (budget − CUDA context)", format_bytes(r["allocator_cap_bytes"]))
    for s in r["oom_step_downs"]:
        table.add_row(f"out of memory in {PHASE_LABELS.get(s['phase'], s['phase'])}", s["action"])
    if (compiled := r.get("compile")) is not None:
        table.add_row(*compile_row(compiled))
    check = r.get("forecast_check")
    if check:
        rows = (("step", "predicted_step_s", "measured_step_s", format_seconds),
                ("peak", "predicted_peak_bytes", "measured_peak_bytes", format_bytes))
        for name, predicted_key, measured_key, shown in rows:
            predicted, measured, error = check[predicted_key], check[measured_key], check[f"{name}_error"]
            if measured is None:  # a CPU has no device allocator: there is no peak to predict or check
                text = "not measurable on this device"
            elif predicted is None:
                text = "no forecast yet (cached for the next run)"
            elif error is None:
                text = f"{shown(predicted)} (not measurable here)"
            else:
                text = f"{shown(predicted)} vs {shown(measured)} ({error * 100:+.1f}%, {check[f'{name}_source']})"
            table.add_row(f"{name}: forecast vs measured", text)
    table.add_row("cache decisions", f"{r['cache_decisions_total']} ({r['cache_releases']} releases)")
    t = r["telemetry"]
    table.add_row("telemetry samples", str(t["samples"]))
    table.add_row("peak torch reserved / NVML used", f"{format_bytes(t['torch_reserved_peak'])} / "
                                                     f"{format_bytes(t['nvml_used_peak'])}")
    if on_cpu:
        table.add_row("peak RSS (host)", format_bytes(t["host_rss_peak"]))
    else:
        table.add_row("peak RSS / pinned (host)",
                      f"{format_bytes(t['host_rss_peak'])} / {format_bytes(t['pinned_peak'])}")
    if (host := host_check_row(r)) is not None:
        table.add_row(*host)
    if r["events_dropped"]:
        table.add_row("events dropped (totals are partial)", str(r["events_dropped"]))
    console.print(table)
    if r["steps"]:
        console.print(_steps_table(r["steps"], bool(cache)))
    console.print("\n".join(plain(line) for line in t["final"]), markup=False, highlight=False)
    # after the table, unwrapped: paths an operator copies
    console.print(plain(f"wrote {_files_line(r['files'])}"), markup=False, highlight=False, soft_wrap=True)
    for note in r["notes"]:
        console.print(plain(f"note: {note}"), markup=False, highlight=False, soft_wrap=True)


def _steps_table(steps: list[dict[str, Any]], cached: bool) -> Table:
    """One row per denoise step, a figure per column: readable at 80 columns (the main table's two columns
    would wrap a step's four figures)."""
    table = Table(show_edge=True, box=None, padding=(0, 1))
    for name in ("step", "time", "stall", "copied", *(("cache hits", "skipped") if cached else ())):
        table.add_column(name, justify="right", no_wrap=True)
    for s in steps:
        hits = ((f"{s['cache_hits']}/{s['cache_forwards']}", format_bytes(s["skipped_bytes"]))
                if cached and s.get("cache_forwards") else (("-", "-") if cached else ()))
        table.add_row(str(s["step"]), format_seconds(s["wall_s"]), format_seconds(s["stall_s"]),
                      format_bytes(s["h2d_bytes"]), *hits)
    return table


def _files_line(files: list[str]) -> str:
    if len(files) <= 2:
        return ", ".join(files) or "nothing"
    return f"{len(files)} files: {files[0]} … {files[-1]}"
