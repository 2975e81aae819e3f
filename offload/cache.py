"""Bounded retention of the device allocator cache at component boundaries (after each staged component).

Releasing the caching allocator's free blocks (`empty_cache`) after every staged component costs
re-allocation (and sometimes a synchronizing cudaMalloc) on the next stage; keeping them costs
device memory other processes cannot use. The rule: release when the cached bytes exceed a fraction
of the device (default 25 %) or free memory is below a fraction (default 5 %); release when the
numbers cannot be read; release when forced after a failure. Every decision is published.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .devices import as_device, is_cuda
from .events import CacheDecision, EventBus, NullBus
from .units import format_bytes


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """Allocator and device numbers in bytes: torch reserved/allocated, device free/total."""

    reserved: int
    allocated: int
    free: int
    total: int


def read_cuda_memory(device: torch.device) -> MemoryReading:
    free, total = torch.cuda.mem_get_info(device)
    return MemoryReading(
        reserved=torch.cuda.memory_reserved(device),
        allocated=torch.cuda.memory_allocated(device),
        free=free,
        total=total,
    )


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def _check_fraction(name: str, value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return float(value)


class AllocatorCache:
    """Decides, at each component boundary, whether to release the allocator cache."""

    def __init__(
        self,
        device: torch.device | str,
        *,
        bus: EventBus | None = None,
        max_cached_fraction: float = 0.25,
        min_free_fraction: float = 0.05,
        read_memory: Callable[[], MemoryReading] | None = None,
        empty_cache: Callable[[], None] | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.max_cached_fraction = _check_fraction("max_cached_fraction", max_cached_fraction)
        self.min_free_fraction = _check_fraction("min_free_fraction", min_free_fraction)
        self._bus = bus or NullBus()
        self._has_allocator = read_memory is not None or is_cuda(self.device)
        if read_memory is None and is_cuda(self.device):
            read_memory = lambda: read_cuda_memory(as_device(self.device))  # noqa: E731 - resolved when read
        self._read_memory = read_memory
        if empty_cache is None:
            empty_cache = torch.cuda.empty_cache if is_cuda(self.device) else (lambda: None)
        self._empty_cache = empty_cache
        self.releases = 0

    def release_if_needed(self, force: bool = False, context: str = "") -> bool:
        """Apply the rule, publish a CacheDecision, and return True when the cache was released."""
        if not self._has_allocator:
            self._publish("retain", "no device allocator (cpu)", force, context, None)
            return False
        reading: MemoryReading | None = None
        try:
            assert self._read_memory is not None
            reading = self._read_memory()
            error = None
        except Exception as exc:
            error = f"telemetry unavailable: {type(exc).__name__}: {exc}"
        if force:
            release, reason = True, "forced after failure"
        elif error is not None or reading is None:
            release, reason = True, error or "telemetry unavailable"
        else:
            release, reason = self._rule(reading)
        if release:
            self._empty_cache()
            self.releases += 1
        self._publish("release" if release else "retain", reason, force, context, reading)
        return release

    def _rule(self, r: MemoryReading) -> tuple[bool, str]:
        cached = max(0, r.reserved - r.allocated)
        reasons: list[str] = []
        if cached > self.max_cached_fraction * r.total:
            limit = _percent(self.max_cached_fraction)
            reasons.append(f"cached {format_bytes(cached)} > {limit} of {format_bytes(r.total)}")
        if r.free < self.min_free_fraction * r.total:
            reasons.append(
                f"free {format_bytes(r.free)} < {_percent(self.min_free_fraction)} of {format_bytes(r.total)}"
            )
        if reasons:
            return True, "; ".join(reasons)
        return False, "within bounds"

    def _publish(self, action: str, reason: str, forced: bool, context: str, r: MemoryReading | None) -> None:
        self._bus.publish(
            CacheDecision(
                action=action,  # type: ignore[arg-type]
                reason=reason,
                forced=forced,
                context=context,
                reserved=r.reserved if r else None,
                allocated=r.allocated if r else None,
                cached=max(0, r.reserved - r.allocated) if r else None,
                free=r.free if r else None,
                total=r.total if r else None,
            )
        )
