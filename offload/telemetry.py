"""Memory telemetry: torch caching allocator, NVML and host RAM, sampled on a background thread.

Every reader degrades instead of raising: a group that cannot be read at all carries
`unavailable` (the reason), a single failed query leaves its field `None` with the reason in
`errors[field]`. The console and headless reports render the same values with the same labels
(design.md §4), so the labels live here, next to the numbers they describe. Torch only; this
module never imports Textual.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from .events import EventBus, TelemetryEvent
from .units import NA, format_bytes, format_rate

# ---------------------------------------------------------------------------------------------
# Labels (design.md §4: label panels exactly). Sizes are decimal: 1 GB = 10^9 bytes.
# ---------------------------------------------------------------------------------------------

UNITS_NOTE = "GB = 10^9 bytes"

LABELS: dict[str, str] = {
    "torch.allocated": "torch allocated (live tensors)",
    "torch.reserved": "torch reserved (caching allocator)",
    "torch.cached": "cached = reserved − allocated",
    "torch.peak": "torch peak (max allocated since reset)",
    "torch.alloc_retries": "torch alloc retries (flush + retry)",
    "torch.free": "mem_get_info free (device-wide)",
    "torch.total": "mem_get_info total",
    "nvml.total": "NVML total",
    "nvml.used": "NVML used (all processes + context)",
    "nvml.free": "NVML free",
    "nvml.reserved": "NVML reserved (driver/firmware)",
    "nvml.pcie_rx": "NVML PCIe RX (host→GPU)",
    "nvml.pcie_tx": "NVML PCIe TX (GPU→host)",
    "nvml.gpu_util": "NVML GPU util",
    "nvml.mem_util": "NVML mem util (bandwidth busy, not capacity)",
    "free_for_us": "free for us = NVML free + torch cached",
    "host.rss": "process RSS",
    "host.pinned": "pinned bytes held (engine)",
    "host.total": "RAM total",
    "host.available": "RAM available",
}


# ---------------------------------------------------------------------------------------------
# Value types
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchMemory:
    """torch.cuda caching-allocator numbers for one device (bytes; `alloc_retries` is a count)."""

    allocated: int | None = None
    reserved: int | None = None
    cached: int | None = None
    peak: int | None = None
    alloc_retries: int | None = None
    free: int | None = None
    total: int | None = None
    device_name: str | None = None
    unavailable: str | None = None
    errors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class NvmlMemory:
    """NVML device numbers. `reserved` is driver/firmware memory (v2 API only), not torch's.

    PCIe rates are bytes per second; utilizations are percent. `memory_api` says which
    memory call answered ("v2", or "v1" on old drivers).
    """

    device_name: str | None = None
    total: int | None = None
    used: int | None = None
    free: int | None = None
    reserved: int | None = None
    pcie_rx_bytes_per_s: int | None = None
    pcie_tx_bytes_per_s: int | None = None
    gpu_util_pct: int | None = None
    mem_util_pct: int | None = None
    memory_api: str | None = None
    unavailable: str | None = None
    errors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostMemory:
    """Host RAM. `total`/`available` are capped by the cgroup limit when one is set.

    `host_total` is the machine's RAM regardless of the cgroup, for the "(host has X)" note.
    """

    rss: int | None = None
    pinned_bytes: int | None = None
    total: int | None = None
    available: int | None = None
    cgroup_limit: int | None = None
    host_total: int | None = None
    unavailable: str | None = None
    errors: Mapping[str, str] = field(default_factory=dict)


NO_SOURCE = "no source configured"


@dataclass(frozen=True, slots=True, kw_only=True)
class TelemetrySnapshot:
    """One sample of every group; `t` is `time.monotonic()` (comparable with event times)."""

    t: float
    torch: TorchMemory = field(default_factory=lambda: TorchMemory(unavailable=NO_SOURCE))
    nvml: NvmlMemory = field(default_factory=lambda: NvmlMemory(unavailable=NO_SOURCE))
    host: HostMemory = field(default_factory=lambda: HostMemory(unavailable=NO_SOURCE))

    @property
    def free_for_us(self) -> int | None:
        """Device memory this process could still get: NVML free + torch cached (design §4).

        Falls back to cudaMemGetInfo's free (also device-wide) when NVML cannot say; None
        when either term is unknown.
        """
        free = self.nvml.free if self.nvml.free is not None else self.torch.free
        cached = self.torch.cached
        if free is None or cached is None:
            return None
        return free + cached

    @property
    def free_for_us_source(self) -> str:
        """Which free figure `free_for_us` used ("NVML", "mem_get_info" or "")."""
        if self.torch.cached is None:
            return ""
        if self.nvml.free is not None:
            return "NVML"
        return "mem_get_info" if self.torch.free is not None else ""


class Source(Protocol):
    """Anything with a `read()` that returns one group (and never raises)."""

    def read(self) -> TorchMemory | NvmlMemory | HostMemory: ...


def _reason(exc: BaseException) -> str:
    """A short human reason for an exception (NVMLError's str is its NVML error text)."""
    text = str(exc).strip()
    return text or type(exc).__name__


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
                gpu_util_pct=int(util.gpu) if util is not None else None,
                mem_util_pct=int(util.memory) if util is not None else None,
                memory_api=api,
                errors=errors,
            )

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


# ---------------------------------------------------------------------------------------------
# Sampler
# ---------------------------------------------------------------------------------------------

MAX_HZ = 100.0


def validate_hz(hz: float) -> float:
    """Sampling rate in Hz: a finite number in (0, 100]."""
    try:
        value = float(hz)
    except (TypeError, ValueError):
        raise ValueError(f"telemetry rate must be a number of Hz, got {hz!r}") from None
    if not math.isfinite(value) or value <= 0 or value > MAX_HZ:
        raise ValueError(f"telemetry rate must be > 0 and <= {MAX_HZ:g} Hz, got {hz!r}")
    return value


_GROUP_OF = {TorchMemory: "torch", NvmlMemory: "nvml", HostMemory: "host"}
_EMPTY = {"torch": TorchMemory, "nvml": NvmlMemory, "host": HostMemory}


class TelemetrySampler:
    """Samples its sources at `hz` on a daemon thread and publishes `TelemetryEvent`s.

    Ticks follow a fixed schedule (start + k/hz); a read slower than the period skips the
    missed ticks instead of bursting (counted in `overruns`). `clock` and `wait` are
    injectable: `wait(timeout) -> bool` returns True when the sampler should stop.
    """

    def __init__(
        self,
        *sources: Source,
        bus: EventBus,
        hz: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        self._sources = list(sources)
        self._bus = bus
        self._hz = validate_hz(hz)
        self._clock = clock
        self._stop = threading.Event()
        self._wait = wait if wait is not None else self._stop.wait
        self._read_lock = threading.Lock()
        self._latest: TelemetrySnapshot | None = None
        self._thread: threading.Thread | None = None
        self.samples = 0
        self.overruns = 0

    @property
    def hz(self) -> float:
        return self._hz

    @hz.setter
    def hz(self, value: float) -> None:
        self._hz = validate_hz(value)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def latest(self) -> TelemetrySnapshot | None:
        """The newest snapshot (from the thread or `sample_now`), or None before the first."""
        return self._latest

    def sample_now(self, publish: bool = False) -> TelemetrySnapshot:
        """Read every source synchronously; optionally publish it like a scheduled sample."""
        groups: dict[str, Any] = {}
        with self._read_lock:
            t = self._clock()
            for source in self._sources:
                try:
                    value = source.read()
                except Exception as exc:  # a source broke its never-raise promise
                    name = getattr(source, "group", None)
                    if name in _EMPTY:
                        groups[name] = _EMPTY[name](unavailable=f"source failed: {_reason(exc)}")
                    continue
                name = _GROUP_OF.get(type(value))
                if name is not None:
                    groups[name] = value
            snapshot = TelemetrySnapshot(t=t, **groups)
            self._latest = snapshot
            self.samples += 1
        if publish:
            self._bus.publish(TelemetryEvent(t=snapshot.t, snapshot=snapshot))
        return snapshot

    def start(self) -> None:
        """Start the sampling thread (no-op when already running)."""
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="omni-telemetry", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop and join the thread (idempotent; safe before `start`)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        next_t = self._clock()
        while not self._stop.is_set():
            self.sample_now(publish=True)
            period = 1.0 / self._hz
            next_t += period
            now = self._clock()
            if now > next_t:  # fell behind: skip the missed ticks, keep the phase
                missed = math.floor((now - next_t) / period) + 1
                self.overruns += missed
                next_t += missed * period
            if self._wait(max(0.0, next_t - now)) or self._stop.is_set():
                break

    def close(self) -> None:
        """Stop sampling and close sources that hold resources (NVML)."""
        self.stop()
        for source in self._sources:
            close = getattr(source, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()


# ---------------------------------------------------------------------------------------------
# Formatting (console and headless reports)
# ---------------------------------------------------------------------------------------------

def format_na(reason: str | None) -> str:
    """How a missing value reads: "N/A (reason)" or plain "N/A"."""
    return f"{NA} ({reason})" if reason else NA


def format_unavailable(reason: str) -> str:
    """How a missing group reads, e.g. "unavailable: no CUDA device"."""
    return f"unavailable: {reason}"


@dataclass(frozen=True, slots=True)
class Reading:
    """One labelled number of a snapshot: the raw value (for plots), its text, its N/A reason."""

    key: str
    label: str
    value: float | None
    text: str
    reason: str | None = None


def reading_text(r: Reading) -> str:
    """The value text, or "N/A (reason)" when the value is missing."""
    return r.text if r.value is not None else format_na(r.reason)


def _reading(key: str, value: int | float | None, text: str, group: Any, field_name: str) -> Reading:
    reason = None
    if value is None:
        reason = group.unavailable or group.errors.get(field_name) or "not reported"
    return Reading(key, LABELS[key], None if value is None else float(value), text, reason)


def torch_readings(m: TorchMemory) -> list[Reading]:
    """The torch allocator rows, in display order."""
    rows = [
        ("torch.allocated", "allocated", m.allocated, format_bytes(m.allocated)),
        ("torch.reserved", "reserved", m.reserved, format_bytes(m.reserved)),
        ("torch.cached", "cached", m.cached, format_bytes(m.cached)),
        ("torch.peak", "peak", m.peak, format_bytes(m.peak)),
        (
            "torch.alloc_retries",
            "alloc_retries",
            m.alloc_retries,
            NA if m.alloc_retries is None else str(m.alloc_retries),
        ),
        ("torch.free", "free", m.free, format_bytes(m.free)),
    ]
    return [_reading(k, v, t, m, f) for k, f, v, t in rows]


def nvml_readings(m: NvmlMemory) -> list[Reading]:
    """The NVML rows, in display order."""
    pct = [NA if v is None else f"{v} %" for v in (m.gpu_util_pct, m.mem_util_pct)]
    rows = [
        ("nvml.total", "total", m.total, format_bytes(m.total)),
        ("nvml.used", "used", m.used, format_bytes(m.used)),
        ("nvml.free", "free", m.free, format_bytes(m.free)),
        ("nvml.reserved", "reserved", m.reserved, format_bytes(m.reserved)),
        ("nvml.pcie_rx", "pcie_rx", m.pcie_rx_bytes_per_s, format_rate(m.pcie_rx_bytes_per_s)),
        ("nvml.pcie_tx", "pcie_tx", m.pcie_tx_bytes_per_s, format_rate(m.pcie_tx_bytes_per_s)),
        ("nvml.gpu_util", "gpu_util", m.gpu_util_pct, pct[0]),
        ("nvml.mem_util", "mem_util", m.mem_util_pct, pct[1]),
    ]
    return [_reading(k, v, t, m, f) for k, f, v, t in rows]


def free_for_us_reading(s: TelemetrySnapshot) -> Reading:
    """The free-for-us row; its reason names the missing term."""
    value = s.free_for_us
    reason = None
    if value is None:
        if s.torch.cached is None:
            reason = "torch cached: " + (s.torch.unavailable or s.torch.errors.get("cached", "not reported"))
        else:
            reason = "NVML free: " + (s.nvml.unavailable or s.nvml.errors.get("free", "not reported"))
    text = format_bytes(value)
    if value is not None and s.free_for_us_source == "mem_get_info":
        text += " (mem_get_info free; NVML N/A)"
    as_float = None if value is None else float(value)
    return Reading("free_for_us", LABELS["free_for_us"], as_float, text, reason)


def host_readings(m: HostMemory) -> list[Reading]:
    """The host rows, in display order; a cgroup limit is noted on the total."""
    total_text = format_bytes(m.total)
    if m.cgroup_limit is not None and m.total is not None:
        total_text += f" (cgroup limit; host has {format_bytes(m.host_total)})"
    rows = [
        ("host.rss", "rss", m.rss, format_bytes(m.rss)),
        ("host.pinned", "pinned_bytes", m.pinned_bytes, format_bytes(m.pinned_bytes)),
        ("host.total", "total", m.total, total_text),
        ("host.available", "available", m.available, format_bytes(m.available)),
    ]
    return [_reading(k, v, t, m, f) for k, f, v, t in rows]


def describe_snapshot(s: TelemetrySnapshot) -> list[str]:
    """Plain-text report lines of a snapshot (headless `--once` style output)."""
    lines: list[str] = [f"telemetry ({UNITS_NOTE})"]
    torch_title = "torch" + (f" [{s.torch.device_name}]" if s.torch.device_name else "")
    nvml_title = "NVML" + (f" [{s.nvml.device_name}]" if s.nvml.device_name else "")
    groups: list[tuple[str, Any, list[Reading]]] = [
        (torch_title, s.torch, torch_readings(s.torch)),
        (nvml_title, s.nvml, nvml_readings(s.nvml)),
    ]
    for title, group, readings in groups:
        if group.unavailable:
            lines.append(f"{title}: {format_unavailable(group.unavailable)}")
            continue
        lines.append(f"{title}:")
        lines += [f"  {r.label}: {reading_text(r)}" for r in readings]
    ffu = free_for_us_reading(s)
    lines.append(f"{ffu.label}: {reading_text(ffu)}")
    if s.host.unavailable:
        lines.append(f"host: {format_unavailable(s.host.unavailable)}")
    else:
        lines.append("host:")
        lines += [f"  {r.label}: {reading_text(r)}" for r in host_readings(s.host)]
    return lines
