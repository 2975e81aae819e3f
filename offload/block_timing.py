"""Per-block compute time of DiT blocks, measured where they run, for the step-time forecast.

A pre-hook and a post-hook on every block record a pair of timing events on the compute stream
(CUDA) or read the wall clock (CPU). The pre-hook is registered after the streamer's, so on a
streamed block it records after the wait for the block's copy: the pair times compute alone, not
the stall. Events are resolved only in `take()`, which the caller invokes where it synchronizes
anyway (the end of a request), so the hot path never blocks.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from .devices import as_device, current_stream, is_cuda
from .module_hooks import Hooks


class BlockTimer:
    """Times every forward of every block in `blocks` (execution order); `take()` gives the medians."""

    def __init__(self, blocks: Sequence[torch.nn.Module], device: torch.device | str) -> None:
        self.device = as_device(device)
        self._cuda = is_cuda(self.device)
        self._marks: list[list[tuple[Any, Any]]] = [[] for _ in blocks]
        self._open: list[Any] = [None] * len(blocks)
        self._hooks = Hooks()
        for i, block in enumerate(blocks):
            self._hooks.before(block, self._pre(i))
            self._hooks.after(block, self._post(i))

    def _stamp(self) -> Any:
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(current_stream(self.device))
        return event

    def _pre(self, i: int) -> Any:
        @torch.compiler.disable
        def hook(*_: Any) -> None:
            self._open[i] = self._stamp()

        return hook

    def _post(self, i: int) -> Any:
        @torch.compiler.disable
        def hook(*_: Any) -> None:
            start = self._open[i]
            if start is not None:
                self._marks[i].append((start, self._stamp()))
                self._open[i] = None

        return hook

    def take(self, firsts: Sequence[int] = (0,)) -> tuple[list[float], int]:
        """(median seconds per forward of each block, forwards: those of the blocks `firsts`, the first block
        of each alternative DiT (two experts run one per forward), added) since the last call; waits
        for outstanding events on CUDA. The median, because a request's first forward runs cold
        (kernel selection, allocator growth) and would pull a mean up. A block that never ran gets 0.0."""
        means: list[float] = []
        for marks in self._marks:
            if self._cuda and marks:
                marks[-1][1].synchronize()
            seconds = [(e.elapsed_time(f) / 1000.0 if self._cuda else f - e) for e, f in marks]
            means.append(statistics.median(seconds) if seconds else 0.0)
        forwards = sum(len(self._marks[i]) for i in firsts if i < len(self._marks))
        self._marks = [[] for _ in self._marks]
        return means, forwards

    def remove(self) -> None:
        self._hooks.remove()
