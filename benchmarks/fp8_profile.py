"""Where a streamed fp8 step goes, block by block (used by `fp8_stream.py --profile`).

CUDA events on the compute stream around each block: `enter` (a pre-hook registered before the
streamer's, so before it waits for the block's copy and upcasts it), `ready` (a pre-hook registered
after the streamer's: the wait and the upcast are behind it) and `leave` (the block's forward done).
enter→ready is the exposed copy wait plus the upcast, ready→leave the block's compute; the streamer's
own step statistics give the exposed wait, so the upcast is the rest. Each copy's own duration comes
from the streamer's staging events (CUDA events on the copy stream). Per step this says whether the
link is busy the whole step (copy-bound: the step is the bytes over the link's rate), or idle while
compute + upcast run (compute-bound), and how much of each block's copy hides behind the previous
block's compute + upcast (with 2 slots a large block copied behind a small block is exposed).

`upcast_rate(blocks, compute_dtype)` times the conversion alone (every fp8 tensor of every block into
one compute-dtype buffer, as `offload/upcast.py` does): the rate `engine/planning/upcast_cost.py` models.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

import torch

from omni_console.offload.events import EventBus, StagingEvent
from omni_console.offload.module_hooks import Hooks
from omni_console.offload.upcast import is_float8


class BlockEvents:
    """enter / ready / leave CUDA events per block and forward; `install_outer` before the streamer attaches,
    `install_inner` after."""

    def __init__(self, blocks: list[tuple[str, torch.nn.Module]]) -> None:
        self.blocks = blocks
        self.events: dict[str, list[dict[str, torch.cuda.Event]]] = defaultdict(list)
        self._hooks = Hooks()
        self.recording = False

    def _mark(self, name: str, key: str) -> None:
        if not self.recording:
            return
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        rows = self.events[name]
        if key == "enter":
            rows.append({})
        rows[-1][key] = e

    def install_outer(self) -> None:
        for name, m in self.blocks:
            self._hooks.before(m, lambda *_a, n=name: self._mark(n, "enter"))
            self._hooks.after(m, lambda *_a, n=name: self._mark(n, "leave"))

    def install_inner(self) -> None:
        for name, m in self.blocks:
            self._hooks.before(m, lambda *_a, n=name: self._mark(n, "ready"))

    def remove(self) -> None:
        self._hooks.remove()

    def per_block(self) -> list[dict[str, float]]:
        """Median over the recorded forwards: wait_upcast_ms (enter→ready) and compute_ms (ready→leave)."""
        torch.cuda.synchronize()
        out = []
        for name, _ in self.blocks:
            rows = [r for r in self.events[name] if len(r) == 3]
            out.append({"block": name,
                        "wait_upcast_ms": statistics.median(r["enter"].elapsed_time(r["ready"]) for r in rows),
                        "compute_ms": statistics.median(r["ready"].elapsed_time(r["leave"]) for r in rows)})
        return out


def copy_times(bus: EventBus, subscription: Any) -> dict[str, float]:
    """Median copy duration (ms) per block target from the streamer's staging events."""
    times: dict[str, list[float]] = defaultdict(list)
    for event in subscription.drain():
        if isinstance(event, StagingEvent) and event.direction == "h2d" and event.seconds > 0:
            times[event.target].append(event.seconds * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def summarize(per_block: list[dict[str, Any]], step_s: float, stall_s_per_forward: float) -> dict[str, Any]:
    """Per-forward totals and what bounds the step."""
    compute = sum(b["compute_ms"] for b in per_block) / 1e3
    wait_upcast = sum(b["wait_upcast_ms"] for b in per_block) / 1e3
    copies = sum(b.get("copy_ms", 0.0) for b in per_block) / 1e3
    upcast = max(wait_upcast - stall_s_per_forward, 0.0)
    return {"step_s": step_s, "compute_s": compute, "upcast_s": upcast, "stall_s": stall_s_per_forward,
            "copy_s": copies, "link_idle_s": max(step_s - copies, 0.0),
            "outside_blocks_s": max(step_s - compute - wait_upcast, 0.0),
            "bound": "link" if copies >= compute + upcast else "compute+upcast"}


def upcast_rate(blocks: list[torch.nn.Module], compute_dtype: torch.dtype, repeats: int = 5) -> dict[str, float]:
    """fp8 elements converted per second on the device (blocks' fp8 tensors on the device)."""
    tensors = [t for b in blocks for t in [*b.parameters(), *b.buffers()] if is_float8(t.dtype)]
    elements = sum(t.numel() for t in tensors)
    largest = max(t.numel() for t in tensors)
    scratch = torch.empty(largest, dtype=compute_dtype, device=tensors[0].device)
    for t in tensors:  # warm
        scratch[: t.numel()].view(t.shape).copy_(t)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        for t in tensors:
            scratch[: t.numel()].view(t.shape).copy_(t)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / repeats
    return {"fp8_elements": elements, "seconds": seconds, "elements_per_s": elements / seconds,
            "seconds_per_gb": seconds / (elements / 1e9)}
