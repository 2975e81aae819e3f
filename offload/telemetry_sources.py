"""Telemetry sources: the torch caching allocator, NVML and host RAM (psutil, cgroup limits).

Each source's `read()` returns one group from offload/telemetry_types.py and never raises.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .telemetry_types import HostMemory, NvmlMemory, Source, TorchMemory
from .telemetry_types import reason_of as _reason

# ---------------------------------------------------------------------------------------------
# torch
# ---------------------------------------------------------------------------------------------


class TorchMemorySource:
    """Reads the torch caching allocator for `device` ("cuda:0", a torch.device, an index)."""

    group = "torch"

    MEM_GET_INFO_EVERY_S = 2.0
    """`mem_get_info` is a driver call (cudaMemGetInfo); while large copies run it can wait behind
    them and hold up the engine thread's own CUDA calls (measured: mean step time +1.8 % at 10 Hz).
    The allocator counters are host-side and read every sample; free/total from the driver at most
    this often."""

    def __init__(self, device: Any = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._device = device
        self._clock = clock
        self._mem_info: tuple[int, int] | None = None
        self._mem_info_at: float | None = None

    def _cuda_index(self) -> tuple[int | None, str | None]:
        """Resolve the CUDA device index, or the reason there is none."""
        try:
            import torch
        except Exception as exc:  # pragma: no cover - torch is a hard dependency
            return None, f"torch not importable: {_reason(exc)}"
        dev = self._device
        try:
            if dev is None:
                dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
            elif isinstance(dev, int):
                dev = torch.device("cuda", dev)
            else:
                dev = torch.device(dev)
        except Exception as exc:
            return None, f"no CUDA device (bad device {self._device!r}: {_reason(exc)})"
        if dev.type != "cuda":
            return None, f"no CUDA device (device is {dev.type})"
        try:
            if not torch.cuda.is_available():
                return None, "no CUDA device (torch.cuda.is_available() is False)"
            return (dev.index if dev.index is not None else torch.cuda.current_device()), None
        except Exception as exc:
            return None, f"no CUDA device ({_reason(exc)})"

    def read(self) -> TorchMemory:
        index, why = self._cuda_index()
        if index is None:
            return TorchMemory(unavailable=why or "no CUDA device")
        import torch

        errors: dict[str, str] = {}

        def q(name: str, fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except Exception as exc:
                errors[name] = _reason(exc)
                return None

        allocated = q("allocated", lambda: int(torch.cuda.memory_allocated(index)))
        reserved = q("reserved", lambda: int(torch.cuda.memory_reserved(index)))
        peak = q("peak", lambda: int(torch.cuda.max_memory_allocated(index)))
        retries = q("alloc_retries", lambda: int(torch.cuda.memory_stats(index).get("num_alloc_retries", 0)))
        info = self._mem_info
        now = self._clock()
        if info is None or self._mem_info_at is None or now - self._mem_info_at >= self.MEM_GET_INFO_EVERY_S:
            info = self._mem_info = q("free", lambda: torch.cuda.mem_get_info(index))
            self._mem_info_at = now
        if info is None:
            errors["total"] = errors.get("free", "mem_get_info failed")
        name = q("device_name", lambda: str(torch.cuda.get_device_name(index)))
        cached = reserved - allocated if reserved is not None and allocated is not None else None
        if cached is None:
            errors["cached"] = "needs reserved and allocated"
        return TorchMemory(
            allocated=allocated,
            reserved=reserved,
            cached=cached,
            peak=peak,
            alloc_retries=retries,
            free=int(info[0]) if info is not None else None,
            total=int(info[1]) if info is not None else None,
            device_name=name,
            errors=errors,
        )


# ---------------------------------------------------------------------------------------------
# NVML
# ---------------------------------------------------------------------------------------------


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
    throughput is a 20 ms NVML sample per direction, so each read can take ~40 ms.
    """

    group = "nvml"

    def __init__(self, index: int | str = 0, *, nvml: ModuleType | None = None, pcie: bool = True) -> None:
        self._target = index
        self._nvml = nvml
        self._pcie = pcie
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
                errors=errors,
            )

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


# ---------------------------------------------------------------------------------------------
# Host
# ---------------------------------------------------------------------------------------------

# cgroup v1 reports "no limit" as a huge page-aligned number (e.g. 9223372036854771712).
_CGROUP_V1_UNLIMITED = 1 << 60


def parse_cgroup_limit(text: str) -> int | None:
    """A cgroup memory limit file's value in bytes, or None for "max"/unlimited/garbage."""
    value = text.strip()
    if not value or value == "max":
        return None
    try:
        n = int(value)
    except ValueError:
        return None
    return n if 0 < n < _CGROUP_V1_UNLIMITED else None


def _own_cgroup_paths(proc_cgroup: Path) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory-controller path) of this process from /proc/self/cgroup."""
    v2 = v1 = None
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def read_cgroup_limit(
    root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> int | None:
    """This process's cgroup memory limit (v2 `memory.max`, else v1 `memory.limit_in_bytes`).

    Looks in the process's own cgroup first, then at the mount root (inside a container's
    cgroup namespace the own path is often "/" or not mounted). None when no limit is set.
    """
    v2, v1 = _own_cgroup_paths(proc_cgroup)
    candidates: list[Path] = []
    if v2 is not None:
        candidates.append(root / v2.lstrip("/") / "memory.max")
    candidates.append(root / "memory.max")
    if v1 is not None:
        candidates.append(root / "memory" / v1.lstrip("/") / "memory.limit_in_bytes")
    candidates.append(root / "memory" / "memory.limit_in_bytes")
    seen: set[Path] = set()
    for path in candidates:
        if path in seen:
            continue
        seen.add(path)
        try:
            text = path.read_text()
        except OSError:
            continue
        return parse_cgroup_limit(text)
    return None


def _default_pinned() -> Callable[[], int] | None:
    try:
        from .pinned import pinned_bytes_held  # written alongside the pinned arenas
    except Exception:
        return None
    return pinned_bytes_held


class HostSource:
    """Process RSS, engine-held pinned bytes and RAM, capped by the cgroup limit if set.

    `pinned_bytes` is any callable returning bytes; by default the pinned-arena accounting of
    `omni_console.offload.pinned`, and when that is missing the field is N/A (not a fake 0).
    """

    group = "host"

    def __init__(
        self,
        pinned_bytes: Callable[[], int] | None = None,
        *,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        proc_cgroup: Path = Path("/proc/self/cgroup"),
    ) -> None:
        self._pinned = pinned_bytes if pinned_bytes is not None else _default_pinned()
        self._cgroup_root = cgroup_root
        self._proc_cgroup = proc_cgroup

    def read(self) -> HostMemory:
        try:
            import psutil
        except Exception as exc:
            return HostMemory(unavailable=f"psutil not installed: {_reason(exc)}")
        errors: dict[str, str] = {}
        rss = pinned = host_total = host_avail = limit = None
        try:
            rss = int(psutil.Process().memory_info().rss)
        except Exception as exc:
            errors["rss"] = _reason(exc)
        if self._pinned is None:
            errors["pinned_bytes"] = "pinned accounting not available (offload.pinned missing)"
        else:
            try:
                pinned = int(self._pinned())
            except Exception as exc:
                errors["pinned_bytes"] = _reason(exc)
        try:
            vm = psutil.virtual_memory()
            host_total, host_avail = int(vm.total), int(vm.available)
        except Exception as exc:
            errors["total"] = errors["available"] = _reason(exc)
        try:
            limit = read_cgroup_limit(self._cgroup_root, self._proc_cgroup)
        except Exception as exc:
            errors["cgroup_limit"] = _reason(exc)
        total, available = host_total, host_avail
        if limit is not None:
            total = limit if total is None else min(total, limit)
            if available is not None:
                available = min(available, total)
        return HostMemory(
            rss=rss,
            pinned_bytes=pinned,
            total=total,
            available=available,
            cgroup_limit=limit,
            host_total=host_total,
            errors=errors,
        )


def default_sources(device: Any = None, pinned_bytes: Callable[[], int] | None = None) -> list[Source]:
    """torch, NVML (index mapped through CUDA_VISIBLE_DEVICES) and host sources for `device`."""
    index = 0
    try:
        import torch

        dev = torch.device(device) if device is not None and not isinstance(device, int) else None
        if isinstance(device, int):
            index = device
        elif dev is not None and dev.type == "cuda" and dev.index is not None:
            index = dev.index
    except Exception:
        pass
    return [TorchMemorySource(device), NvmlSource(nvml_target_for(index)), HostSource(pinned_bytes)]

