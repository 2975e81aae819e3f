"""`--compile off|regional|auto` (plan, run, the console) and its lines in the plan and the run report. Torch-free.

The engine compiles the denoisers' repeated blocks with their streaming hooks outside the graphs
(offload/block_compile.py); `auto` decides per request from the device and the forecast
(engine/planning/compile_choice.py).
"""

from __future__ import annotations

import argparse
from typing import Any

COMPILE_MODES = ("off", "regional", "auto")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")


def add_compile_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compile", choices=COMPILE_MODES, default="off",
                        help="regional: torch.compile each repeated block class of the denoiser once (the streaming "
                             "hooks stay outside the graphs; output not bit-identical to eager); auto: only on a CUDA "
                             "device with Triton where the forecast says it pays back within the request; off "
                             "(default)")
    parser.add_argument("--compile-backend", choices=COMPILE_BACKENDS, default="inductor",
                        help="torch.compile's backend for --compile (default inductor; eager and aot_eager check the "
                             "graphs on a CPU)")


def compile_options(args: argparse.Namespace) -> dict[str, Any]:
    """The `EngineOptions` fields the flags set."""
    return {"compile": getattr(args, "compile", "off") or "off",
            "compile_backend": getattr(args, "compile_backend", "inductor") or "inductor"}


def compile_row(c: dict[str, Any]) -> tuple[str, str]:
    """The run report's row: whether it ran compiled, the compile phase against the forecast, Dynamo's counts."""
    if not c["on"]:
        return "compile", f"off ({c['why']})"
    phase = (f"{c['seconds']:.1f} s {c['expect']} (forecast {c['forecast_seconds']:.1f} s)"
             if c["expect"] in ("cold", "warm") else f"{c['seconds']:.1f} s ({c['expect']})")
    workspace = c.get("workspace_bytes")
    measured = f"; workspace {workspace / 2**20:,.0f} MiB" if workspace is not None else ""
    return "compile (regional)", (f"{phase}; {c['compiles']} compiled, {c['recompiles']} recompiles, "
                                  f"{c['graph_breaks']} graph breaks{measured}")


def describe_compile_phase(event: Any) -> str:
    """A `CompilePhase` event in a line: `request 2: compile 41.3 s cold (forecast 50.0 s), 3 compiled, 0 recompiles,
    0 graph breaks`, or why it ran uncompiled."""
    head = f"request {event.request_id}: compile"
    if not event.on:
        return f"{head} off ({event.why})"
    c = {"on": True, "why": event.why, "expect": event.expect, "seconds": event.seconds,
         "forecast_seconds": event.forecast_seconds, "compiles": event.compiles, "recompiles": event.recompiles,
         "graph_breaks": event.graph_breaks, "workspace_bytes": event.workspace_bytes}
    return f"{head} {compile_row(c)[1]}"
