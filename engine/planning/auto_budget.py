"""`--vram-budget auto`: the device memory free now, less a margin the plan shows.

Read through NVML when it answers (no CUDA context is created, so `plan` stays quick and the free
figure is not already short of our own context), plus what this process already holds there;
else `cudaMemGetInfo` plus what torch has reserved and the context it just created. The margin
leaves room for other processes' growth and the reading's age. A CPU has no device budget: one
line, exit 2.
"""

from __future__ import annotations

from ...offload.units import format_bytes
from ..errors import ConfigError

AUTO_MARGIN_FRACTION = 0.02
AUTO_MIN_MARGIN = 256_000_000


class Budget(int):
    """A budget in bytes that remembers how it was obtained (`note`, shown as the plan's first line)."""

    note: str

    def __new__(cls, value: int, note: str = "") -> Budget:
        self = super().__new__(cls, value)
        self.note = note
        return self


def auto_margin(free: int) -> int:
    return max(AUTO_MIN_MARGIN, int(AUTO_MARGIN_FRACTION * free))


def _cuda_index(device: str | None) -> int:
    return int(device.split(":")[1]) if device and ":" in device else 0


def _nvml_free(index: int) -> tuple[int, str] | None:
    """(free bytes for this process, how it was read) from NVML, None when NVML cannot say."""
    from ...offload.nvml_source import NvmlSource, nvml_target_for

    source = NvmlSource(nvml_target_for(index), pcie=False)
    try:
        memory = source.read()
        if memory.free is None:
            return None
        ours, _ = source.process_used()
        return memory.free + (ours or 0), "NVML"
    finally:
        source.close()


def _torch_free(index: int) -> tuple[int, str] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    device = torch.device("cuda", index)
    free, _ = torch.cuda.mem_get_info(device)
    from .device_footprint import device_overhead
    from .request_profile import device_name

    context = device_overhead(device_name(device)).context_bytes  # the context mem_get_info just created
    return free + torch.cuda.memory_reserved(device) + context, "cudaMemGetInfo + this process's context"


def auto_budget(device: str | None, flag: str = "--vram-budget auto") -> Budget:
    """The budget for `auto` on `device` (None: the default device); ConfigError on a CPU."""
    if device is not None and not device.startswith("cuda"):
        raise ConfigError(f"{flag}: the device is {device}, which has no device memory to budget; "
                          "give a size such as 24GB")
    index = _cuda_index(device)
    found = _nvml_free(index) or _torch_free(index)
    if found is None:
        raise ConfigError(f"{flag}: no CUDA device answers here (a CPU run); give a size such as 24GB")
    free, how = found
    margin = auto_margin(free)
    if free - margin < 1:
        raise ConfigError(f"{flag}: only {format_bytes(free)} free on cuda:{index}")
    note = (f"budget auto: {format_bytes(free - margin)} = free now {format_bytes(free)} ({how}) - margin "
            f"{format_bytes(margin)} ({AUTO_MARGIN_FRACTION * 100:g}% of free, at least "
            f"{format_bytes(AUTO_MIN_MARGIN)}: other processes' growth)")
    return Budget(free - margin, note)
