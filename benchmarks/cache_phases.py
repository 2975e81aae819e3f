"""Where one step of a cached forward goes, for benchmarks/cache_stream.py: the step cut at the probe block and the
last block, so a GPU run tells which part of a hit (or of the miss after one) costs more than the resident model.

Phases, per forward:
  before_probe  forward start → the probe (head) block starts: embeddings, and on the device the wait for the
                probe's bytes (the ring's copy event) when the probe is streamed
  probe         the probe block and the cache's decision (diffusers reads its verdict with a device→host sync
                inside the probe's hook, so the host waits here for everything queued before)
  blocks        the blocks after the probe: on a hit only hooks run (the device idles while the host walks them),
                on a miss the streamed forward
  tail          the last block's end → the forward's end: final norm and projection
On CUDA each cut is an event on the compute stream (elapsed times on the device, host gaps included where the
device idled); on a CPU the wall clock.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from omni_console.offload.module_hooks import Hooks

PHASES = ("before_probe", "probe", "blocks", "tail")


class StepPhases:
    """Marks at the forward's start, the probe's start and end, the last block's end and the forward's end."""

    def __init__(self, model: torch.nn.Module, probe: torch.nn.Module, last: torch.nn.Module,
                 device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._marks: list[Any] = []
        self.steps: list[dict[str, float]] = []
        self._hooks = Hooks()
        self._hooks.before(model, lambda *_: self._mark(reset=True))
        self._hooks.before(probe, lambda *_: self._mark())
        self._hooks.after(probe, lambda *_: self._mark())  # after the ring's and the cache's post-hooks
        self._hooks.after(last, lambda *_: self._mark())
        self._hooks.after(model, lambda *_: self._mark())

    def _mark(self, reset: bool = False) -> None:
        if reset:
            self._marks = []
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def take(self) -> dict[str, float]:
        """The last forward's phases in seconds (after the caller synchronized the device)."""
        marks = self._marks
        if len(marks) != len(PHASES) + 1:
            raise RuntimeError(f"expected {len(PHASES) + 1} marks in a forward, got {len(marks)}")
        if self._cuda:
            gaps = [a.elapsed_time(b) / 1000.0 for a, b in zip(marks, marks[1:], strict=False)]
        else:
            gaps = [b - a for a, b in zip(marks, marks[1:], strict=False)]
        step = dict(zip(PHASES, gaps, strict=True))
        self.steps.append(step)
        return step

    def remove(self) -> None:
        self._hooks.remove()


def mean_phases(steps: list[dict[str, float]], hits: list[int], hit: bool) -> dict[str, float] | None:
    """Mean of each phase over the steps after the first whose hit flag is `hit` (None: no such step)."""
    chosen = [s for s, h in zip(steps[1:], hits[1:], strict=True) if bool(h) == hit]
    if not chosen:
        return None
    return {p: sum(s[p] for s in chosen) / len(chosen) for p in PHASES}


def phase_lines(runs: dict[str, dict[str, Any]]) -> list[str]:
    """One line per run and kind of step: each phase in milliseconds (what the next GPU run reads first)."""
    lines = []
    for name, run in runs.items():
        for label, hit in (("hit", True), ("miss", False)):
            mean = mean_phases(run["phases"], run["hits"], hit)
            if mean is not None:
                cells = "  ".join(f"{p} {mean[p] * 1e3:.2f}" for p in PHASES)
                lines.append(f"phases ms, {name}, {label} steps: {cells}")
    return lines
