"""NVML telemetry for one GPU: memory, PCIe and NVLink throughput, utilisation (nvidia-ml-py).

`read()` returns an `NvmlMemory` and never raises; what NVML cannot say is None with its reason.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from .telemetry_types import NvmlMemory
from .telemetry_types import reason_of as _reason


def nvml_target_for(cuda_index: int, env: Mapping[str, str] | None = None) -> int | str:
    """The NVML index (or UUID) of torch's `cuda:<cuda_index>`.

    torch numbers devices after CUDA_VISIBLE_DEVICES; NVML numbers all devices. Entries that
    are neither integers nor UUIDs (MIG names, garbage) fall back to the torch index.
    """
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return cuda_index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if cuda_index >= len(entries):
        return cuda_index
    entry = entries[cuda_index]
    if entry.isdigit():
        return int(entry)
    if entry.startswith("GPU-"):
        return entry
    return cuda_index


ALL_LINKS = 0xFFFFFFFF  # an NVLink field's scope: every link of the GPU together


class NvmlSource:
    """Reads one GPU through NVML (`pynvml` from nvidia-ml-py); initialised lazily, once.

    `target` is an NVML index or a "GPU-..." UUID. `nvml` injects a module in place of
    pynvml (tests). A failed init is remembered and not retried on every sample. PCIe
    throughput is a 20 ms NVML sample per direction, so each read can take ~40 ms. `process`: also
    read this process's row of NVML's process list (`process_used`, the console's memory plot and a
    trace's counters); off where another sampler already reads it (`run`'s peak meter), since each read
    is a walk of the driver's process table beside the load's and the steps' own driver calls.
    """

    group = "nvml"

    def __init__(self, index: int | str = 0, *, nvml: ModuleType | None = None, pcie: bool = True,
                 process: bool = True) -> None:
        self._target = index
        self._nvml = nvml
        self._pcie = pcie
        self._process = process
        self._lock = threading.Lock()
        self._initialized = False
        self._init_error: str | None = None
        self._handle: Any = None
        self._v2_error: str | None = None  # set once v2 memory info failed; then use v1 directly
        self._nvlink_error: str | None = None  # set once NVML said it has no NVLink counters here
        self._nvlink_last: tuple[int, int, int] | None = None  # rx bytes, tx bytes, timestamp µs

    def _module(self) -> ModuleType:
        if self._nvml is None:
            import pynvml  # nvidia-ml-py

            self._nvml = pynvml
        return self._nvml

    def _ensure(self) -> str | None:
        """Init NVML and get the handle; returns the reason when that is impossible."""
        if self._handle is not None:
            return None
        if self._init_error is not None:
            return self._init_error
        try:
            nv = self._module()
        except Exception as exc:
            self._init_error = f"nvidia-ml-py not installed (import pynvml: {_reason(exc)})"
            return self._init_error
        try:
            nv.nvmlInit()
            self._initialized = True
        except Exception as exc:
            self._init_error = f"NVML init failed: {_reason(exc)}"
            return self._init_error
        try:
            if isinstance(self._target, str):
                self._handle = nv.nvmlDeviceGetHandleByUUID(self._target)
            else:
                self._handle = nv.nvmlDeviceGetHandleByIndex(int(self._target))
        except Exception as exc:
            self._init_error = f"NVML device {self._target}: {_reason(exc)}"
            return self._init_error
        return None

    def _memory(self, nv: ModuleType) -> tuple[Any, str]:
        """v2 memory info (has `reserved`), else v1; remembers that v2 failed."""
        if self._v2_error is None:
            try:
                version = nv.nvmlMemory_v2
                return nv.nvmlDeviceGetMemoryInfo(self._handle, version=version), "v2"
            except Exception as exc:
                self._v2_error = _reason(exc)
        return nv.nvmlDeviceGetMemoryInfo(self._handle), "v1"

    def read(self) -> NvmlMemory:
        with self._lock:
            why = self._ensure()
            if why is not None:
                return NvmlMemory(unavailable=why)
            nv = self._module()
            h = self._handle
            errors: dict[str, str] = {}

            def q(names: Sequence[str], fn: Callable[[], Any]) -> Any:
                try:
                    return fn()
                except Exception as exc:
                    for n in names:
                        errors[n] = _reason(exc)
                    return None

            name = q(["device_name"], lambda: nv.nvmlDeviceGetName(h))
            if isinstance(name, bytes):
                name = name.decode(errors="replace")
            mem = q(["total", "used", "free", "reserved"], lambda: self._memory(nv))
            total = used = free = reserved = None
            api = None
            if mem is not None:
                info, api = mem
                total, used, free = int(info.total), int(info.used), int(info.free)
                if api == "v2":
                    reserved = int(info.reserved)
                else:
                    errors["reserved"] = f"v1 memory API has no reserved (v2: {self._v2_error})"
            rx = tx = None
            if self._pcie:
                # NVML reports KB/s (1024 bytes); RX is what the GPU receives (host→device).
                pcie = nv.nvmlDeviceGetPcieThroughput
                rx = q(["pcie_rx"], lambda: 1024 * int(pcie(h, nv.NVML_PCIE_UTIL_RX_BYTES)))
                tx = q(["pcie_tx"], lambda: 1024 * int(pcie(h, nv.NVML_PCIE_UTIL_TX_BYTES)))
            else:
                errors["pcie_rx"] = errors["pcie_tx"] = "PCIe sampling off"
            nvlink_rx, nvlink_tx = self._nvlink_rates(nv, h)
            util = q(["gpu_util", "mem_util"], lambda: nv.nvmlDeviceGetUtilizationRates(h))
            process = None
            if self._process:
                process = q(["process_used"], lambda: _process_bytes(nv, h, os.getpid()))
            else:
                errors["process_used"] = "process sampling off"
            if name is None and mem is None and util is None:  # the device stopped answering (lost, reset)
                return NvmlMemory(unavailable=f"NVML queries failed: {errors['total']}")
            return NvmlMemory(
                device_name=name,
                total=total,
                used=used,
                free=free,
                reserved=reserved,
                pcie_rx_bytes_per_s=rx,
                pcie_tx_bytes_per_s=tx,
                nvlink_rx_bytes_per_s=nvlink_rx,
                nvlink_tx_bytes_per_s=nvlink_tx,
                gpu_util_pct=int(util.gpu) if util is not None else None,
                mem_util_pct=int(util.memory) if util is not None else None,
                memory_api=api,
                process_used=process,
                errors=errors,
            )

    def process_used(self, pid: int | None = None) -> tuple[int | None, str | None]:
        """(device bytes NVML counts for process `pid` (default: this one), None) or (None, the reason).

        NVML lists compute processes by their host PID: inside a PID namespace (a container) this
        process may not be found under its own PID; the reason says so."""
        pid = os.getpid() if pid is None else pid
        with self._lock:
            why = self._ensure()
            if why is not None:
                return None, why
            nv = self._module()
            try:
                procs = list(nv.nvmlDeviceGetComputeRunningProcesses(self._handle))
            except Exception as exc:
                return None, f"NVML process list: {_reason(exc)}"
        for p in procs:
            if int(p.pid) == pid:
                used = getattr(p, "usedGpuMemory", None)
                if used is None or int(used) >= 2**63:  # NVML_VALUE_NOT_AVAILABLE (e.g. Windows WDDM)
                    return None, "NVML does not report this process's memory"
                return int(used), None
        return None, f"process {pid} not in NVML's list ({len(procs)} listed; a PID namespace hides it)"

    def _nvlink_rates(self, nv: ModuleType, h: Any) -> tuple[int | None, int | None]:
        """NVLink bytes per second received and sent over all links, from NVML's cumulative data
        counters (KiB) and their timestamps between this sample and the last. None until there are
        two samples, and for good once NVML says this GPU has no such counters (most have no NVLink:
        not an error, so not in `errors`)."""
        if self._nvlink_error is not None:
            return None, None
        try:
            fields = nv.nvmlDeviceGetFieldValues(h, [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS),
                                                     (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS)])
            failed = [int(f.nvmlReturn) for f in fields if int(f.nvmlReturn) != 0]
            if failed:
                self._nvlink_error = f"NVML reports no NVLink throughput here (return code {failed[0]})"
                return None, None
            now = (1024 * int(fields[0].value.ullVal), 1024 * int(fields[1].value.ullVal), int(fields[0].timestamp))
        except Exception as exc:
            self._nvlink_error = f"NVLink counters: {_reason(exc)}"
            return None, None
        last, self._nvlink_last = self._nvlink_last, now
        if last is None or now[2] <= last[2]:
            return None, None
        seconds = (now[2] - last[2]) / 1e6
        return int(max(now[0] - last[0], 0) / seconds), int(max(now[1] - last[1], 0) / seconds)

    def close(self) -> None:
        """Shut NVML down if this source initialised it (idempotent)."""
        with self._lock:
            if self._initialized and self._nvml is not None:
                with contextlib.suppress(Exception):
                    self._nvml.nvmlShutdown()
            self._initialized = False
            self._handle = None
            self._init_error = None


def _process_bytes(nv: ModuleType, handle: Any, pid: int) -> int:
    """Device bytes NVML counts for process `pid` (raises, with the reason, when it does not list or report it)."""
    for p in nv.nvmlDeviceGetComputeRunningProcesses(handle):
        if int(p.pid) == pid:
            used = getattr(p, "usedGpuMemory", None)
            if used is None or int(used) >= 2**63:  # NVML_VALUE_NOT_AVAILABLE (e.g. Windows WDDM)
                raise RuntimeError("NVML does not report this process's memory")
            return int(used)
    raise RuntimeError(f"process {pid} not in NVML's list (a PID namespace hides it)")
