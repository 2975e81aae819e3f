"""`run`'s host memory line: the measured peak RSS against the host forecast (issue 35); the report's keys
are the engine's (`engine/service/report.py`)."""

from __future__ import annotations

from typing import Any

from ..offload.units import format_bytes


def host_check_row(r: dict[str, Any]) -> tuple[str, str] | None:
    """("host peak RSS: predicted vs measured", "36.0 GB vs 35.9 GB (+0.2%, default)"), None: nothing measured."""
    measured, predicted = r.get("host_peak_bytes"), r.get("predicted_host_peak_bytes")
    if measured is None:
        return None
    if predicted is None:
        return "host peak RSS (VmHWM)", format_bytes(measured)
    error = r.get("host_peak_error")
    shown = f" ({error * 100:+.1f}%, {r['host_forecast_source'] or 'default'})" if error is not None else ""
    return "host peak RSS: predicted vs measured", f"{format_bytes(predicted)} vs {format_bytes(measured)}{shown}"
