"""Telemetry readers degrade to reasons, never exceptions; the sampler keeps its rate and stops."""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch

from omni_console.console import telemetry_text as tt
from omni_console.offload import telemetry as tm
from omni_console.offload.events import EventBus, TelemetryEvent
from omni_console.offload.telemetry import (
    HostMemory,
    HostSource,
    NvmlMemory,
    NvmlSource,
    TelemetrySampler,
    TelemetrySnapshot,
    TorchMemory,
    TorchMemorySource,
)

GB = 10**9


# --------------------------------------------------------------------------- fake pynvml


class FakeNVMLError(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)


def fake_nvml(*, v2: bool = True, fail: set[str] = frozenset(), init_error: str | None = None,
              nvlink: list[tuple[int, int, int]] | None = None):
    """A pynvml stand-in: one H200-like device; `fail` names queries that raise NVMLError. `nvlink`:
    the NVLink data counters each read returns (rx KiB, tx KiB, timestamp µs); None: no NVLink
    (every field answers NVML_ERROR_NOT_SUPPORTED, 3)."""
    mod = types.ModuleType("pynvml")
    mod.NVMLError = FakeNVMLError
    mod.nvmlMemory_v2 = 0x2000028
    mod.NVML_PCIE_UTIL_TX_BYTES = 0
    mod.NVML_PCIE_UTIL_RX_BYTES = 1
    mod.calls = []

    def init():
        mod.calls.append("init")
        if init_error:
            raise FakeNVMLError(init_error)

    def shutdown():
        mod.calls.append("shutdown")

    def handle(i):
        if "handle" in fail:
            raise FakeNVMLError("Invalid Argument")
        return ("h", i)

    def name(h):
        if "name" in fail:
            raise FakeNVMLError("Not Supported")
        return b"NVIDIA H200"

    def meminfo(h, version=None):
        if version is not None:
            mod.calls.append("mem_v2")
            if not v2:
                raise FakeNVMLError("Function Not Found")
            assert version == mod.nvmlMemory_v2
            return types.SimpleNamespace(total=150 * GB, used=10 * GB, free=139 * GB, reserved=1 * GB)
        mod.calls.append("mem_v1")
        if "mem_v1" in fail:
            raise FakeNVMLError("Unknown Error")
        return types.SimpleNamespace(total=150 * GB, used=11 * GB, free=139 * GB)

    def pcie(h, counter):
        if "pcie" in fail:
            raise FakeNVMLError("Not Supported")
        return {mod.NVML_PCIE_UTIL_RX_BYTES: 50_000_000, mod.NVML_PCIE_UTIL_TX_BYTES: 1000}[counter]

    def util(h):
        if "util" in fail:
            raise FakeNVMLError("No Permission")
        return types.SimpleNamespace(gpu=87, memory=41)

    mod.nvmlInit = init
    mod.nvmlShutdown = shutdown
    mod.nvmlDeviceGetHandleByIndex = handle
    mod.nvmlDeviceGetHandleByUUID = handle
    mod.nvmlDeviceGetName = name
    mod.nvmlDeviceGetMemoryInfo = meminfo
    mod.nvmlDeviceGetPcieThroughput = pcie
    mod.nvmlDeviceGetUtilizationRates = util
    mod.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
    mod.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
    counters = iter(nvlink or [])

    def field_values(h, ids):
        mod.calls.append("fields")
        assert [i for i, _ in ids] == [139, 138] and {scope for _, scope in ids} == {0xFFFFFFFF}
        if nvlink is None:
            return [types.SimpleNamespace(nvmlReturn=3, value=None, timestamp=0) for _ in ids]
        rx, tx, ts = next(counters)
        return [types.SimpleNamespace(nvmlReturn=0, value=types.SimpleNamespace(ullVal=v), timestamp=ts)
                for v in (rx, tx)]

    mod.nvmlDeviceGetFieldValues = field_values
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=1, usedGpuMemory=5 * GB),
        types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=3 * GB)]
    return mod


def test_nvlink_rates_come_from_two_samples_of_the_counters():
    nv = fake_nvml(nvlink=[(1000, 10, 1_000_000), (1000 + 500_000, 10 + 1024, 1_500_000)])
    source = NvmlSource(0, nvml=nv)
    first = source.read()
    assert (first.nvlink_rx_bytes_per_s, first.nvlink_tx_bytes_per_s) == (None, None)  # a rate needs two
    second = source.read()
    assert second.nvlink_rx_bytes_per_s == 500_000 * 1024 * 2  # KiB over 0.5 s
    assert second.nvlink_tx_bytes_per_s == 1024 * 1024 * 2
    assert second.errors == {}
    assert second.process_used == 3 * GB  # this process's row of NVML's process list, not the device's total


def test_a_source_told_not_to_read_the_process_list_never_walks_it_and_says_why():
    nv = fake_nvml()
    walked: list[object] = []
    listed = nv.nvmlDeviceGetComputeRunningProcesses
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: walked.append(h) or listed(h)
    off = NvmlSource(0, nvml=nv, process=False).read()
    assert walked == [] and off.process_used is None
    assert off.errors == {"process_used": "process sampling off"}
    assert off.used == 10 * GB and off.pcie_rx_bytes_per_s is not None  # the device's figures are read as before
    on = NvmlSource(0, nvml=nv).read()
    assert len(walked) == 1 and on.process_used == 3 * GB


def test_a_gpu_without_nvlink_is_asked_once_and_reports_none():
    nv = fake_nvml()
    source = NvmlSource(0, nvml=nv)
    readings = [source.read() for _ in range(3)]
    assert all(r.nvlink_rx_bytes_per_s is None and r.nvlink_tx_bytes_per_s is None for r in readings)
    assert nv.calls.count("fields") == 1 and all(r.errors == {} for r in readings)


def test_nvml_v2_reads_every_field_with_reserved():
    nv = fake_nvml()
    m = NvmlSource(0, nvml=nv).read()
    assert m.unavailable is None and m.errors == {}
    assert m.device_name == "NVIDIA H200"
    assert (m.total, m.used, m.free, m.reserved) == (150 * GB, 10 * GB, 139 * GB, 1 * GB)
    assert m.memory_api == "v2"
    assert m.pcie_rx_bytes_per_s == 50_000_000 * 1024  # KB/s -> bytes/s
    assert m.pcie_tx_bytes_per_s == 1000 * 1024
    assert (m.gpu_util_pct, m.mem_util_pct) == (87, 41)


def test_nvml_v2_failure_falls_back_to_v1_once():
    nv = fake_nvml(v2=False)
    src = NvmlSource(0, nvml=nv)
    m = src.read()
    assert m.memory_api == "v1"
    assert (m.total, m.used, m.free) == (150 * GB, 11 * GB, 139 * GB)
    assert m.reserved is None
    assert "v1 memory API has no reserved" in m.errors["reserved"]
    assert "Function Not Found" in m.errors["reserved"]
    src.read()
    assert nv.calls.count("mem_v2") == 1  # v2 not retried on every sample
    assert nv.calls.count("init") == 1  # init once, lazily


def test_nvml_per_query_failures_are_na_with_reason():
    nv = fake_nvml(v2=False, fail={"pcie", "util", "mem_v1"})
    m = NvmlSource(0, nvml=nv).read()
    assert m.unavailable is None
    assert m.device_name == "NVIDIA H200"
    assert m.total is None and m.errors["total"] == "Unknown Error"
    assert m.pcie_rx_bytes_per_s is None and m.errors["pcie_rx"] == "Not Supported"
    assert m.gpu_util_pct is None and m.errors["mem_util"] == "No Permission"
    rows = {r.key: r for r in tt.nvml_readings(m)}
    assert rows["nvml.free"].reason == "Unknown Error"
    assert tt.reading_text(rows["nvml.gpu_util"]) == "N/A (No Permission)"


def test_nvml_device_that_stops_answering_makes_group_unavailable():
    """Every query failing (a lost GPU, a driver reset) is not a row of N/As but a group that is gone."""
    nv = fake_nvml(v2=False, fail={"name", "pcie", "util", "mem_v1"})
    m = NvmlSource(0, nvml=nv).read()
    assert m.unavailable == "NVML queries failed: Unknown Error"
    assert m.total is None and m.device_name is None


def test_nvml_init_and_handle_failures_make_group_unavailable():
    nv = fake_nvml(init_error="Driver Not Loaded")
    src = NvmlSource(0, nvml=nv)
    assert src.read().unavailable == "NVML init failed: Driver Not Loaded"
    src.read()
    assert nv.calls.count("init") == 1  # failure remembered
    m = NvmlSource(3, nvml=fake_nvml(fail={"handle"})).read()
    assert m.unavailable == "NVML device 3: Invalid Argument"


def test_nvml_close_shuts_down_only_when_initialised():
    nv = fake_nvml()
    src = NvmlSource(0, nvml=nv)
    src.close()
    assert "shutdown" not in nv.calls
    src.read()
    src.close()
    src.close()
    assert nv.calls.count("shutdown") == 1


def test_nvml_library_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    m = NvmlSource(0).read()
    assert m.unavailable is not None and m.unavailable.startswith("nvidia-ml-py not installed")


def test_nvml_on_this_machine_degrades_without_raising():
    m = NvmlSource(0).read()  # real pynvml; no driver on CI
    assert isinstance(m, NvmlMemory)
    if m.unavailable is None:  # pragma: no cover - GPU machine
        assert m.total is not None


def test_nvml_target_follows_cuda_visible_devices():
    assert tm.nvml_target_for(0, {}) == 0
    assert tm.nvml_target_for(1, {"CUDA_VISIBLE_DEVICES": "3,5"}) == 5
    assert tm.nvml_target_for(0, {"CUDA_VISIBLE_DEVICES": "GPU-abc,1"}) == "GPU-abc"
    assert tm.nvml_target_for(4, {"CUDA_VISIBLE_DEVICES": "3"}) == 4


# --------------------------------------------------------------------------- torch


@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu")])
def test_torch_on_cpu_is_unavailable_not_an_exception(device, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    m = TorchMemorySource(device).read()
    assert m.unavailable is not None and m.unavailable.startswith("no CUDA device")
    assert m.allocated is None


def test_torch_cuda_device_without_cuda_is_unavailable(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert TorchMemorySource("cuda:0").read().unavailable == (
        "no CUDA device (torch.cuda.is_available() is False)"
    )
    assert "bad device" in TorchMemorySource("nonsense").read().unavailable


def test_torch_values_and_per_query_failure(monkeypatch):
    c = torch.cuda
    monkeypatch.setattr(c, "is_available", lambda: True)
    monkeypatch.setattr(c, "memory_allocated", lambda i: 3 * GB)
    monkeypatch.setattr(c, "memory_reserved", lambda i: 5 * GB)
    monkeypatch.setattr(c, "max_memory_allocated", lambda i: 4 * GB)
    monkeypatch.setattr(c, "memory_stats", lambda i: {"num_alloc_retries": 2})
    monkeypatch.setattr(c, "mem_get_info", lambda i: (100 * GB, 150 * GB))
    monkeypatch.setattr(c, "get_device_name", lambda i: "Fake GPU")
    m = TorchMemorySource("cuda:1").read()
    assert m.unavailable is None and m.errors == {}
    assert (m.allocated, m.reserved, m.cached, m.peak) == (3 * GB, 5 * GB, 2 * GB, 4 * GB)
    assert (m.alloc_retries, m.free, m.total, m.device_name) == (2, 100 * GB, 150 * GB, "Fake GPU")

    def boom(i):
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(c, "memory_stats", boom)
    monkeypatch.setattr(c, "memory_reserved", boom)
    m = TorchMemorySource("cuda:1").read()
    assert m.alloc_retries is None and "launch failure" in m.errors["alloc_retries"]
    assert m.cached is None and m.errors["cached"] == "needs reserved and allocated"
    assert m.allocated == 3 * GB


def test_free_for_us_is_nvml_free_plus_torch_cached():
    s = TelemetrySnapshot(
        t=0.0,
        torch=TorchMemory(allocated=3 * GB, reserved=5 * GB, cached=2 * GB, free=90 * GB),
        nvml=NvmlMemory(free=100 * GB),
    )
    assert s.free_for_us == 102 * GB and s.free_for_us_source == "NVML"
    s2 = TelemetrySnapshot(t=0.0, torch=TorchMemory(cached=2 * GB, free=90 * GB))
    assert s2.free_for_us == 92 * GB and s2.free_for_us_source == "mem_get_info"
    s3 = TelemetrySnapshot(t=0.0, torch=TorchMemory(unavailable="no CUDA device"))
    assert s3.free_for_us is None
    assert "no CUDA device" in tt.free_for_us_reading(s3).reason


# --------------------------------------------------------------------------- host / cgroup


def test_cgroup_v2_limit_from_own_cgroup(tmp_path: Path):
    (tmp_path / "proc").write_text("0::/user.slice/job\n")
    d = tmp_path / "cg" / "user.slice" / "job"
    d.mkdir(parents=True)
    (d / "memory.max").write_text("8589934592\n")
    assert tm.read_cgroup_limit(tmp_path / "cg", tmp_path / "proc") == 8589934592
    (d / "memory.max").write_text("max\n")
    assert tm.read_cgroup_limit(tmp_path / "cg", tmp_path / "proc") is None


def test_cgroup_v1_limit_and_unlimited(tmp_path: Path):
    (tmp_path / "proc").write_text("4:memory:/docker/abc\n0::/\n")
    d = tmp_path / "cg" / "memory" / "docker" / "abc"
    d.mkdir(parents=True)
    (d / "memory.limit_in_bytes").write_text("4294967296\n")
    assert tm.read_cgroup_limit(tmp_path / "cg", tmp_path / "proc") == 4294967296
    (d / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert tm.read_cgroup_limit(tmp_path / "cg", tmp_path / "proc") is None
    assert tm.read_cgroup_limit(tmp_path / "missing", tmp_path / "nope") is None
    assert tm.parse_cgroup_limit("garbage") is None


def test_host_source_caps_total_by_cgroup(tmp_path: Path):
    (tmp_path / "proc").write_text("0::/\n")
    (tmp_path / "memory.max").write_text("1000000\n")  # 1 MB: below any real machine
    h = HostSource(lambda: 123, cgroup_root=tmp_path, proc_cgroup=tmp_path / "proc").read()
    assert h.unavailable is None
    assert h.cgroup_limit == 1_000_000 and h.total == 1_000_000
    assert h.available is not None and h.available <= 1_000_000
    assert h.host_total is not None and h.host_total > h.total
    assert h.pinned_bytes == 123 and h.rss and h.rss > 0
    total_row = next(r for r in tt.host_readings(h) if r.key == "host.total")
    assert "cgroup limit; host has" in total_row.text


def test_host_source_pinned_callable_failure_is_na(tmp_path: Path):
    def broken() -> int:
        raise RuntimeError("arena gone")

    h = HostSource(broken, cgroup_root=tmp_path, proc_cgroup=tmp_path / "p").read()
    assert h.pinned_bytes is None and h.errors["pinned_bytes"] == "arena gone"
    assert h.cgroup_limit is None


# --------------------------------------------------------------------------- sampler


class CountingSource:
    group = "host"

    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> HostMemory:
        self.reads += 1
        return HostMemory(rss=self.reads)


class FakeTime:
    """A clock whose `wait` advances time instantly; stops the sampler after `limit` waits."""

    def __init__(self, limit: int) -> None:
        self.now = 100.0
        self.waits: list[float] = []
        self.limit = limit
        self.done = threading.Event()

    def clock(self) -> float:
        return self.now

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        self.now += timeout
        if len(self.waits) >= self.limit:
            self.done.set()
            return True
        return False


def test_sampler_keeps_a_fixed_schedule_with_injected_clock():
    bus = EventBus()
    sub = bus.subscribe()
    ft = FakeTime(limit=50)
    sampler = TelemetrySampler(CountingSource(), bus=bus, hz=10.0, clock=ft.clock, wait=ft.wait)
    sampler.start()
    assert ft.done.wait(10.0)
    sampler.stop()
    events = sub.drain()
    assert len(events) == 50
    assert all(isinstance(e, TelemetryEvent) for e in events)
    times = [e.snapshot.t for e in events]
    assert times == pytest.approx([100.0 + 0.1 * k for k in range(50)])
    assert [e.snapshot.host.rss for e in events] == list(range(1, 51))
    assert sampler.latest() is events[-1].snapshot
    assert sampler.overruns == 0


def test_sampler_skips_missed_ticks_when_reads_are_slow():
    bus = EventBus()
    sub = bus.subscribe()
    ft = FakeTime(limit=10)

    class Slow(CountingSource):
        def read(self) -> HostMemory:
            ft.now += 0.25  # each read takes 2.5 periods at 10 Hz
            return super().read()

    sampler = TelemetrySampler(Slow(), bus=bus, hz=10.0, clock=ft.clock, wait=ft.wait)
    sampler.start()
    assert ft.done.wait(10.0)
    sampler.stop()
    times = [e.snapshot.t for e in sub.drain()]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(g == pytest.approx(0.3) for g in gaps)  # next tick on the 0.1 grid, no burst
    assert sampler.overruns == 2 * (len(times) - 1) + 2


def test_sampler_real_thread_publishes_and_stops_cleanly():
    bus = EventBus()
    sub = bus.subscribe()
    sampler = TelemetrySampler(CountingSource(), bus=bus, hz=100.0)
    sampler.start()
    sampler.start()  # idempotent
    deadline = time.monotonic() + 10.0
    while len(sub) < 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    sampler.stop()
    sampler.stop()  # idempotent
    assert not sampler.running
    n = len(sub)
    assert n >= 5
    time.sleep(0.05)
    assert len(sub) == n  # nothing after stop
    assert not any(t.name == "omni-telemetry" and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize("hz", [0, -1, 100.5, float("nan"), float("inf"), "fast"])
def test_sampler_rate_is_validated(hz):
    with pytest.raises(ValueError, match="telemetry rate"):
        TelemetrySampler(bus=EventBus(), hz=hz)
    s = TelemetrySampler(bus=EventBus(), hz=100)
    with pytest.raises(ValueError):
        s.hz = hz


def test_sample_now_routes_groups_and_survives_a_raising_source():
    class Boom:
        group = "nvml"

        def read(self):
            raise RuntimeError("driver fell over")

    torch_src = types.SimpleNamespace(read=lambda: TorchMemory(allocated=7, reserved=9, cached=2))
    bus = EventBus()
    sub = bus.subscribe()
    sampler = TelemetrySampler(torch_src, Boom(), bus=bus, clock=lambda: 42.0)
    snap = sampler.sample_now()
    assert snap.t == 42.0
    assert snap.torch.allocated == 7
    assert snap.nvml.unavailable == "source failed: driver fell over"
    assert snap.host.unavailable == tm.NO_SOURCE
    assert len(sub) == 0  # sample_now does not publish unless asked
    sampler.sample_now(publish=True)
    assert len(sub) == 1


def test_default_sources_on_cpu_give_reasons(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    sampler = TelemetrySampler(*tm.default_sources("cpu", pinned_bytes=lambda: 0), bus=EventBus())
    snap = sampler.sample_now()
    assert snap.torch.unavailable.startswith("no CUDA device")
    assert isinstance(snap.nvml, NvmlMemory)
    assert snap.host.rss and snap.host.pinned_bytes == 0
    text = "\n".join(tt.describe_snapshot(snap))
    assert "torch: unavailable: no CUDA device" in text
    assert "process RSS" in text
    sampler.close()


def test_telemetry_does_not_import_textual():
    import subprocess

    code = "import sys, omni_console.offload.telemetry; print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_mem_get_info_is_a_slow_path_read_at_most_every_two_seconds(monkeypatch):
    c = torch.cuda
    calls = []
    monkeypatch.setattr(c, "is_available", lambda: True)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        monkeypatch.setattr(c, name, lambda i: GB)
    monkeypatch.setattr(c, "memory_stats", lambda i: {})
    monkeypatch.setattr(c, "get_device_name", lambda i: "Fake GPU")
    monkeypatch.setattr(c, "mem_get_info", lambda i: (calls.append(i), (len(calls) * GB, 150 * GB))[1])
    now = [100.0]
    source = TorchMemorySource("cuda:0", clock=lambda: now[0])
    assert source.read().free == 1 * GB
    now[0] += 1.9
    assert source.read().free == 1 * GB and len(calls) == 1  # cached between driver reads
    now[0] += 0.2
    assert source.read().free == 2 * GB and len(calls) == 2
