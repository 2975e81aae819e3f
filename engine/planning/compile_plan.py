"""The compile forecast of one request under a plan: the step's compute and transfer from the request forecast,
the signature's record from the cache, the decision from `compile_choice`. Torch-free (`plan` calls it)."""

from __future__ import annotations

from .compile_choice import WORKSPACE_SHARE, CompileForecast, DeviceSupport, choose_compile
from .compile_record import has_inductor_entries, read_record, signature
from .plan import Plan
from .request_forecast import RequestForecast


def step_compute_transfer(plan: Plan, forecast: RequestForecast | None) -> tuple[float | None, float]:
    """(compute seconds or None, link seconds) of one step: the link's share is the streamed bytes of the
    step's forwards over the rate; the compute is the forecast's floor when it lies above the link (a
    compute-bound step), else unknown-and-no-gain (the link sets the step)."""
    if forecast is None or forecast.floor_s is None:
        return None, 0.0
    forwards = 2 if (forecast.size.guidance or 0) > 1 else 1  # guidance: two forwards a step (estimated)
    per_forward = plan.forecast.transfer_seconds(forecast.bandwidth) or 0.0
    transfer = per_forward * forwards
    return forecast.floor_s, transfer


def largest_block_bytes(plan: Plan) -> int:
    """The largest DiT block's bytes (resident or streamed): the compile workspace scales with one block's graph."""
    return max((b.nbytes for b in plan.blocks), default=0)


def budget_workspace(plan: Plan, asked: str, measured: int | None = None) -> tuple[int, str | None]:
    """(bytes, the reason line) `--vram-budget` holds back for the compile workspace (0, None when off):
    `measured` (an earlier run's, `recorded_workspace`) where there is one, else the estimate."""
    if asked == "off":
        return 0, None
    if measured is not None:
        return measured, (f"compile workspace {measured / 2**20:,.0f} MiB held back from the budget (measured by "
                          f"an earlier run at this size)")
    nbytes = int(WORKSPACE_SHARE * largest_block_bytes(plan))
    return nbytes, (f"compile workspace {nbytes / 2**20:,.0f} MiB held back from the budget (estimated: "
                    f"{WORKSPACE_SHARE:g} x the largest block)")


def recorded_workspace(plan: Plan, size_label: str, device_name: str, backend: str) -> int | None:
    """The compile workspace an earlier run measured for this plan at this size (None: none yet, or its record
    unusable)."""
    record, _ = read_record(plan_signature(plan, size_label, device_name, backend))
    return record.workspace_bytes if record is not None else None


def installed_torch() -> str:
    """The installed torch's version as its package says it (a wheel's `torch.__version__` may add a local label
    the package metadata lacks: `plan` reads the metadata without importing torch, so the run keys by it too)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "unknown"


def plan_signature(plan: Plan, size_label: str, device_name: str, backend: str,
                   classes: list[str] | None = None) -> str:
    """The compile record's key for this plan at this size: one function for `plan`, the forecast before a request
    and the record after it, so what a run measured is what the next `plan` reads. `device_name`: the GPU's name
    (`request_profile.device_name`, NVML's for `plan`) or "cpu"."""
    names = classes if classes is not None else block_classes(plan)
    return signature(plan.model.pipeline_class, names, size_label, device_name, backend, None, installed_torch())


def block_classes(plan: Plan) -> list[str]:
    """The denoisers' block kinds the plan streams (one compiled graph each, per shape)."""
    return sorted({plan.model.block_kind}) if plan.model.block_kind else []


def compile_forecast(plan: Plan, forecast: RequestForecast | None, asked: str, device: DeviceSupport, *,
                     steps: int, device_name: str, backend: str, classes: list[str] | None = None,
                     notes: list[str] | None = None) -> CompileForecast:
    """`choose_compile` for this plan and request (`notes` gets a line for an unusable cache record)."""
    names = classes if classes is not None else block_classes(plan)
    size = forecast.size.label() if forecast is not None else "default size"
    sig = plan_signature(plan, size, device_name, backend, names)
    record, problem = read_record(sig) if asked != "off" else (None, None)
    if problem and notes is not None:
        notes.append(problem)
    compute, transfer = step_compute_transfer(plan, forecast)
    return choose_compile(asked, device, classes=max(len(names), 1), steps=steps, compute_s=compute,
                          transfer_s=transfer, largest_block_bytes=largest_block_bytes(plan),
                          record=record, warm_cache=record is not None and has_inductor_entries())


def plan_compile(plan: Plan, forecast: RequestForecast | None, asked: str, device_name: str, steps: int | None,
                 backend: str = "inductor") -> CompileForecast:
    """`plan`'s compile forecast, without touching the device: CUDA unless the plan is for the CPU, Triton if
    installed, the compute capability unknown (the run checks it)."""
    import importlib.util

    on_cuda = device_name != "cpu"
    support = DeviceSupport(cuda=on_cuda, triton=on_cuda and importlib.util.find_spec("triton") is not None,
                            capability=None)
    return compile_forecast(plan, forecast, asked, support, steps=steps or 28, device_name=device_name,
                            backend=backend)


def compile_document(c: CompileForecast) -> dict[str, object]:
    """`plan --json`'s `compile`."""
    return {"asked": c.asked, "on": c.on, "why": c.why, "expect": c.expect, "seconds": round(c.seconds, 3),
            "seconds_source": c.seconds_source, "gain_s": round(c.gain_s, 3), "workspace_bytes": c.workspace_bytes,
            "workspace_source": c.workspace_source, "max_abs_diff": c.max_abs_diff, "lines": c.lines()}
