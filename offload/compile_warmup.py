"""The compile stack's once-per-process start-up, done while the model loads instead of in the first step.

The first `torch.compile` of a process pays for more than its graphs: Dynamo's and Inductor's modules are
imported, Dynamo's trace rules and Inductor's code cache and device checks are set up (on a CPU, the vector ISA
probe; on a GPU, Triton and its driver). Measured on a 2-core CPU (a Flux-width model, `--compile regional`), a
warm start's compile phase was 4.3 s, of which about 2.5 s was this start-up: the graphs themselves hit every
cache. A load reads gigabytes from disk with its reader threads and mostly waits, so the start-up runs beside it
in a thread of its own: a tiny function compiled and run once on the device with the same backend.

Only one compile runs at a time: the first request waits for this one (`wait`) before its blocks compile, and
counts the wait as part of its compile phase. Dynamo's frame callback is per thread, so the loading thread's
own frames are never traced. A failure here changes nothing (the request's own compile meets the same problem
and reports it); it is kept for the log.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch


def _tiny(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x) * 2 + 1


class CompileWarmup:
    """Starts at once; `wait()` joins it and returns the seconds waited."""

    def __init__(self, device: torch.device, backend: Any) -> None:
        self.device, self.backend = device, backend
        self.seconds: float | None = None  # how long the start-up took (None: still running)
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="compile-warmup", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        start = time.perf_counter()
        try:
            compiled = torch.compile(_tiny, backend=self.backend, fullgraph=True, dynamic=False)
            with torch.no_grad():
                out = compiled(torch.ones(64, device=self.device))
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
            del out
        except Exception as exc:  # the request's own compile reports it
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.seconds = time.perf_counter() - start

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> float:
        """Join the start-up (once it is done, at once); the seconds this call waited."""
        start = time.perf_counter()
        self._thread.join()
        return time.perf_counter() - start
