"""What fp8 storage costs the compute stream: the upcast of each block's fp8 weights, every forward.

`offload/upcast.py` converts a block's float8 tensors into the compute dtype on the device right before
the block runs (streamed blocks from their slot, resident ones by their own hooks). It is a memory-bound
elementwise conversion (1 byte read, 2 or 4 written per element), so its time is modelled as the
block's fp8 element count over a conversion rate of the device kind. The profiled per-block compute is
timed after the upcast (the block timer's hooks run after the ring's), so the step forecast adds it.

Rates (fp8 elements per second), until a device's own is measured:
- CUDA: 2.9e11, from the H200 run of benchmarks/fp8_stream.py (2026-12-01, Flux-dev size, 1024²):
  compute with upcast 0.2016 s against resident bf16 0.1714 s for 8.65e9 fp8 elements (23.80 GB bf16
  less 15.15 GB as stored). `benchmarks/fp8_stream.py` prints the rate it measures (`upcast`).
- CPU: 4.5e7, one thread converting float8_e4m3fn to bfloat16 (torch 2.13, this project's CI machine):
  torch has no vectorized fp8 conversion on CPUs.
"""

from __future__ import annotations

from collections.abc import Sequence

UPCAST_ELEMENTS_PER_S = {"cuda": 2.9e11, "cpu": 4.5e7}


def upcast_rate(device: str) -> float:
    """fp8 elements converted per second on `device` ('cpu', or a GPU's name: CUDA)."""
    return UPCAST_ELEMENTS_PER_S["cpu" if device == "cpu" else "cuda"]


def upcast_seconds(elements: Sequence[int], device: str) -> tuple[float, ...]:
    """Each block's upcast time per forward, from its fp8 element count."""
    rate = upcast_rate(device)
    return tuple(n / rate for n in elements)
