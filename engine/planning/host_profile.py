"""The host forecast learns from a measured request, as the device forecast does (issue 35).

A request measures the process's peak RSS (the kernel's VmHWM: load included). What the model cannot
know in advance is the process's own base RSS: the libraries, the CUDA context's host side, the kernels
loaded for the request, the heap, which differ by machine and versions. So the profile keeps the base that
makes the forecast meet the measured peak, with a key of the plan and load it was measured under. The next
forecast of the same model, device and size uses it whatever its plan, as the device forecast uses the CUDA
context measured by any plan: every other term is the plan's own bytes, so the base carries over, and under
`--ram-budget auto` / `--vram-budget auto` the next plan is rarely the same (the available memory moved by
100 MB, or the measured step moved the planner; issue 35's flux16 forecast after one request was the default
one for that reason). A base learned under another plan is said in a note. A profile is untrusted input: read
through `request_profile.read_profile`, every figure bounded.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

from ...offload.proc_status import status_bytes
from .host_forecast import HostForecast, host_forecast, learned_baseline
from .plan import Plan
from .request_profile import RequestProfile, RequestSize
from .slack_config import plan_key


def host_plan_key(plan: Plan, live_replan: bool) -> str:
    """A key of what shapes the host peak: the plan's (slack_config.plan_key), the load and the tiers."""
    doc = f"{plan_key(plan)}|live={live_replan}|{plan.tiers!r}"
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def host_forecast_for(plan: Plan, size: RequestSize | None, device: str, profile: RequestProfile | None,
                      *, live_replan: bool = False) -> HostForecast:
    """The host forecast with the profile's learned process base (this plan's or another's: module docstring)."""
    baseline = profile.host_baseline_bytes if profile is not None else None
    forecast = host_forecast(plan, size, live_replan=live_replan, on_cpu=device == "cpu", baseline=baseline)
    if baseline is not None and profile is not None and profile.host_plan != host_plan_key(plan, live_replan):
        note = "process base RSS learned from a request of this model under another plan"
        forecast = replace(forecast, notes=(*forecast.notes, note))
    return forecast


def with_host_peak(profile: RequestProfile, plan: Plan, measured_peak: int | None, *,
                   live_replan: bool) -> RequestProfile:
    """The profile with the measured host peak and the baseline learned from it (unchanged: not measured)."""
    if measured_peak is None:
        return profile
    modelled = host_forecast(plan, profile.size, live_replan=live_replan, on_cpu=profile.device == "cpu")
    return profile.model_copy(update={"host_peak_bytes": measured_peak,
                                      "host_baseline_bytes": learned_baseline(measured_peak, modelled),
                                      "host_plan": host_plan_key(plan, live_replan)})


def peak_rss(status: Path = Path("/proc/self/status")) -> int | None:
    """The process's peak RSS so far (VmHWM, Linux), None where the kernel does not say."""
    return status_bytes("VmHWM", status)
