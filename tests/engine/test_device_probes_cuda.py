"""The console's link probe on CUDA: it measures a page-locked copy and leaves no host memory behind (PyTorch's
pinned allocator would have kept its 256 MiB buffer cached for the console's life, outside every forecast)."""

from __future__ import annotations

import pytest
import torch

from omni_console.engine.device_probes import measure_h2d_bandwidth
from omni_console.offload.pinned import arena_bytes_held, pinned_bytes_held

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def test_probe_measures_the_link_and_gives_its_buffer_back():
    device = torch.device("cuda:0")
    torch.cuda.synchronize(device)
    cached_before = torch.cuda.host_memory_stats().get("reserved_bytes.current", 0)
    pinned_before, arena_before = pinned_bytes_held(), arena_bytes_held()
    rate = measure_h2d_bandwidth(device, nbytes=64 * 1024 * 1024)
    assert rate is not None and rate > 1e9  # any PCIe or NVLink-C2C link moves more than 1 GB/s
    assert torch.cuda.host_memory_stats().get("reserved_bytes.current", 0) == cached_before
    assert (pinned_bytes_held(), arena_bytes_held()) == (pinned_before, arena_before)
