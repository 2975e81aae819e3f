"""The compile stack's start-up in a thread beside the load: it finishes on its own, a failure is kept (never
raised), and `wait` joins it."""

from __future__ import annotations

import threading

import torch

from omni_console.offload.compile_warmup import CompileWarmup


def test_the_start_up_compiles_and_runs_a_tiny_graph_in_its_own_thread():
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, _inputs):
        graphs.append(gm)
        return gm.forward

    warmup = CompileWarmup(torch.device("cpu"), backend)
    assert warmup.wait() >= 0.0 and warmup.done
    assert warmup.error is None and warmup.seconds is not None and warmup.seconds > 0
    assert len(graphs) == 1  # Dynamo traced it: its modules and state are set up
    assert not any(t.name == "compile-warmup" and t.is_alive() for t in threading.enumerate())
    assert warmup.wait() < 0.05  # joined: at once


def test_a_failing_start_up_is_kept_for_the_log_and_never_raised():
    def backend(_gm, _inputs):
        raise RuntimeError("no compiler here")

    warmup = CompileWarmup(torch.device("cpu"), backend)
    warmup.wait()
    assert warmup.error is not None and "no compiler here" in warmup.error
