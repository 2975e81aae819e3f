"""The garbage collector around a one-shot run: off while the libraries import and the model loads, then on over
a frozen model while the request runs.

Why off first: the imports of torch, transformers and diffusers and the load build about a million objects and
free few, and the collector's full passes grow with them: seven passes during a `run`'s startup on the 2-core
machine, 1.5 s of a 7.8 s `run` of the demo model (docs/benchmarks.md, "The collector at startup"). Engine.load
already keeps it off while it builds.

Why frozen after: a full pass over that heap holds the GIL for 0.3-0.4 s, and one inside a step stalls the
streamer's copies and the compute alike (measured on an H100: a 419 ms pass inside a 0.55 s step). `gc.freeze()`
moves everything that exists to a generation no pass walks. The collector is on again for the request itself: a
cycle holding a device tensor must not live past its pass.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def loaded() -> None:
    """The model is loaded: freeze what exists, and collect again (only what the request makes)."""
    gc.freeze()
    gc.enable()


@contextmanager
def quiet_until_loaded() -> Iterator[None]:
    """Collector off until `loaded()`; on leaving, everything is collectable again and the caller's setting is back
    (a process that goes on, as a test's, collects the released model)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
        else:
            gc.disable()
