"""`run`'s device memory as the card sees it: the budget's allocator cap, NVML's per-process peak, OOM step-downs.

With `--vram-budget` the process's device memory is the budget (engine/planning/device_footprint.py): the
caching allocator is capped at budget minus the CUDA context before anything loads (expandable
segments asked for first, unless the operator set `PYTORCH_CUDA_ALLOC_CONF`, so fragmentation stays
inside the cap), and the engine loads with live re-plan so an out-of-memory step-down can move
resident blocks. Whatever the budget, NVML's per-process figure is sampled through the load and the
request (its peak in the report), and the context measured at the end is cached for the next plan.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch

from ...offload.nvml_source import NvmlSource, nvml_target_for
from ...offload.process_memory import ProcessPeakMeter, bound_allocator, context_bytes
from ..planning.device_footprint import DeviceOverhead, device_overhead, record_context

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def prefer_expandable_segments() -> bool:
    """Ask torch's allocator for expandable segments (less fragmentation under a cap) unless the operator
    configured it; must run before CUDA's allocator starts. True when set here."""
    if ALLOC_CONF in os.environ:  # set by the operator, even empty (torch's defaults)
        return False
    os.environ[ALLOC_CONF] = "expandable_segments:True"
    return True


@dataclass
class RunMemory:
    """Samples the process's NVML figure from load to the request's end; caps the allocator for a budget."""

    device: torch.device
    device_name: str
    allocator_cap: int | None = None
    meter: ProcessPeakMeter | None = None
    source: NvmlSource | None = None
    overhead: DeviceOverhead | None = None  # what the forecast counted outside torch's allocations
    budget: int | None = None  # the --vram-budget the allocator is capped inside

    @classmethod
    def start(cls, device: torch.device, device_name: str, budget: int | None,
              overhead: DeviceOverhead | None) -> RunMemory:
        memory = cls(device, device_name, budget=budget)
        if device.type != "cuda":
            return memory
        memory.overhead = overhead or device_overhead(device_name)
        memory.source = NvmlSource(nvml_target_for(device.index or 0), pcie=False)
        if budget is not None and overhead is not None:
            # the context as CUDA starts (kernels load lazily: it grows later, the cached figure knows how far)
            started = context_bytes(device, memory.source) or 0
            memory.allocator_cap = budget - max(overhead.context_bytes, started)
            bound_allocator(device, memory.allocator_cap)
        memory.meter = ProcessPeakMeter(memory.source).start()
        return memory

    def finish(self, allocated_peak: int | None = None, reserved_peak: int | None = None) -> dict[str, Any]:
        """The report's fields; the context measured now is cached for the next plan on this device.
        Call `predicted` afterwards for the forecast's process figure.

        NVML is sampled every 50 ms, and under a tight allocator cap torch returns cache at once, so a
        sample can miss a short peak. NVML's figure is the context + torch's reserved bytes, so the peak is
        at least the context + the request's reserved peak (`reserved_peak`, exact; reserved is never below
        `allocated_peak`, the floor where reserved is unknown): the larger is reported, the sampled one beside it."""
        if self.meter is None or self.source is None:
            return {"process_peak_bytes": None, "process_peak_sampled_bytes": None,
                    "process_peak_note": "no device memory to measure (cpu)", "allocator_cap_bytes": None}
        peak = self.meter.stop()
        context = context_bytes(self.device, self.source)
        if self.allocator_cap is not None:
            bound_allocator(self.device, None)  # the request is over: the process (tests: the next one) is not capped
        if context is not None:
            with contextlib.suppress(OSError):  # an unwritable cache costs the next plan its measured figure
                record_context(self.device_name, context)
        self.source.close()
        sampled, note = peak.peak_bytes, peak.reason
        torch_peak = max((v for v in (allocated_peak, reserved_peak) if v is not None), default=None)
        floor = None if context is None or torch_peak is None or sampled is None else context + torch_peak
        if floor is not None and floor > sampled:
            held = "reserved" if reserved_peak is not None and torch_peak == reserved_peak else "allocated"
            note = f"at least the CUDA context + torch's {held} peak (the 50 ms NVML samples missed a shorter peak)"
        return {"process_peak_bytes": max(sampled, floor) if floor is not None else sampled,
                "process_peak_sampled_bytes": sampled, "process_peak_note": note,
                "allocator_cap_bytes": self.allocator_cap, "context_bytes": context}

    def predicted(self, check: Any, measured: int | None) -> dict[str, Any]:
        """The forecast's device memory of the process (its allocated peak + the overhead it counted)
        and its error against NVML's measured peak; empty when either is missing."""
        allocated = getattr(check, "predicted_peak", None)
        if self.overhead is None or allocated is None:
            return {}
        predicted = self.overhead.process_bytes(allocated, getattr(check, "predicted_slack", None), self.budget)
        error = (predicted - measured) / measured if measured else None
        return {"predicted_process_peak_bytes": predicted, "process_peak_error": error,
                "context_source": self.overhead.context_source}


def step_down_docs(result: Any) -> list[dict[str, str]]:
    return [{"phase": e.phase, "component": e.component, "action": e.action, "message": e.message}
            for e in getattr(result, "oom_step_downs", ())]
