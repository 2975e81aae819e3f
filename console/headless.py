"""`omni-console run --headless`: load, generate, write the image, print what happened."""

from __future__ import annotations

import argparse
import json
import threading
from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from ..engine.engine import Engine
from ..engine.runner import GenerateRequest
from ..engine.units import fmt_bytes, fmt_rate, fmt_seconds
from ..offload.errors import ConfigError
from ..offload.events import (
    CacheDecision,
    EngineStateChanged,
    ErrorEvent,
    Event,
    LoadProgress,
    LogEvent,
    OomRetry,
    StagingEvent,
    StepTiming,
    Subscription,
    TelemetryEvent,
)
from ..offload.telemetry import TelemetrySampler, TelemetrySnapshot, default_sources, describe_snapshot


class _Progress(threading.Thread):
    """Prints state changes and step timings to stderr while the engine works (not in --json mode)."""

    def __init__(self, sub: Subscription, console: Console, quiet: bool) -> None:
        super().__init__(daemon=True, name="omni-progress")
        self.sub, self.console, self.quiet, self.stop = sub, console, quiet, threading.Event()
        self.events: list[Event] = []

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self._flush()
        self._flush()

    def _flush(self) -> None:
        for event in self.sub.drain():
            self.events.append(event)
            if self.quiet:
                continue
            if isinstance(event, EngineStateChanged):
                self.console.print(f"[dim]state[/] {event.old} → {event.new} {event.reason}")
            elif isinstance(event, StepTiming):
                self.console.print(f"[dim]step[/] {event.step}/{event.total_steps} {fmt_seconds(event.wall_s)} "
                                   f"(stall {fmt_seconds(event.stall_s)})")
            elif isinstance(event, LoadProgress) and event.done_bytes == event.total_bytes and event.total_bytes:
                self.console.print(f"[dim]load[/] {event.component} {fmt_bytes(event.total_bytes)} ({event.phase})")
            elif isinstance(event, (ErrorEvent, OomRetry)):
                self.console.print(f"[red]{event}[/]")


def summarize(events: list[Event]) -> dict[str, Any]:
    """Staging totals and bandwidth, cache decisions, per-step timings."""
    staging = [e for e in events if isinstance(e, StagingEvent)]
    h2d = [e for e in staging if e.direction == "h2d"]
    moved = sum(e.nbytes for e in h2d)
    secs = sum(e.seconds for e in h2d)
    decisions = [e for e in events if isinstance(e, CacheDecision)]
    return {
        "staging": {
            "h2d_transfers": len(h2d), "h2d_bytes": moved, "h2d_seconds": secs,
            "h2d_bytes_per_s": moved / secs if secs > 0 else None,
            "sync_transfers": sum(1 for e in h2d if e.sync),
            "by_target_kind": dict(Counter("block" if "." in e.target and e.target.split(".")[-1].isdigit()
                                           else "component" for e in h2d)),
        },
        "cache_decisions": [{"action": d.action, "reason": d.reason, "forced": d.forced} for d in decisions],
        "cache_releases": sum(1 for d in decisions if d.action == "release"),
        "log": [e.message for e in events if isinstance(e, LogEvent)],
    }


def telemetry_peaks(events: list[Event]) -> dict[str, Any]:
    """Peaks over the run's telemetry samples (None where a reading was unavailable)."""
    snaps: list[TelemetrySnapshot] = [e.snapshot for e in events if isinstance(e, TelemetryEvent)]

    def peak(get) -> int | None:
        values = [v for v in (get(x) for x in snaps) if v is not None]
        return max(values) if values else None

    return {
        "samples": len(snaps),
        "torch_reserved_peak": peak(lambda x: x.torch.reserved),
        "nvml_used_peak": peak(lambda x: x.nvml.used),
        "host_rss_peak": peak(lambda x: x.host.rss),
        "pinned_peak": peak(lambda x: x.host.pinned_bytes),
    }


def run_headless(args: argparse.Namespace) -> int:
    from .cli import policy_from_args, resolve_model_path

    if not args.headless:
        raise ConfigError("run needs --headless for now (the console app is `omni-console --model PATH`)")
    policy = policy_from_args(args)
    err = Console(stderr=True)
    engine = Engine(resolve_model_path(args.model), device=args.device, variant=args.variant)
    plan = engine.make_plan(policy)  # policy errors before anything is allocated
    progress = _Progress(engine.bus.subscribe(), err, quiet=args.json)
    sampler = TelemetrySampler(*default_sources(engine.device), bus=engine.bus, hz=args.telemetry_hz)
    progress.start()
    sampler.start()
    try:
        load = engine.load(policy)
        request = default_request(engine, prompt=args.prompt, steps=args.steps, height=args.height,
                                  width=args.width, seed=args.seed, guidance=args.guidance)
        result = engine.generate(request)
        final = sampler.sample_now(publish=True)
    except (ConfigError, KeyboardInterrupt):
        raise
    except Exception as exc:  # a load or run failure: one line, memory already released
        err.print(f"omni-console: {engine.state.value}: {type(exc).__name__}: {exc}", markup=False, highlight=False)
        return 1
    finally:
        sampler.close()
        progress.stop.set()
        progress.join()
        engine.close()
    if result.image is not None and hasattr(result.image, "save"):
        args.output.parent.mkdir(parents=True, exist_ok=True)
        result.image.save(args.output)
    report = {
        "model": str(engine.model.path), "device": str(engine.device),
        "policy": json.loads(policy.model_dump_json()),
        "forecast": {"peak_device_weight_bytes": plan.forecast.peak_device_weight_bytes,
                     "pinned_host_bytes": plan.forecast.pinned_host_bytes,
                     "streamed_bytes_per_forward": plan.forecast.streamed_bytes_per_forward},
        "load_seconds": load.seconds, "pinned_bytes": load.pinned_bytes,
        "request_seconds": result.seconds, "peak_allocated_bytes": result.peak_allocated_bytes,
        "steps": [{"step": s.step, "wall_s": s.wall_s, "stall_s": s.stall_s, "h2d_bytes": s.h2d_bytes}
                  for s in result.steps],
        "output": str(args.output) if result.image is not None else None,
        **summarize(progress.events),
        "telemetry": {**telemetry_peaks(progress.events), "final": describe_snapshot(final)},
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report, Console())
    return 0


def default_request(engine: Engine, *, prompt: str, steps: int | None = None, height: int | None = None,
                    width: int | None = None, seed: int = 0, guidance: float | None = None) -> GenerateRequest:
    """A request; for the demo model, unset fields take the demo's working defaults (64 px, 2 steps)."""
    from ..engine.demo_model import DEMO_GENERATION, is_complete

    extra: dict[str, Any] = {}
    if is_complete(engine.model.path):
        d = DEMO_GENERATION
        steps = steps if steps is not None else int(d["num_inference_steps"])
        height = height if height is not None else int(d["height"])
        width = width if width is not None else int(d["width"])
        guidance = guidance if guidance is not None else float(d["guidance_scale"])
        extra["max_sequence_length"] = d["max_sequence_length"]
    return GenerateRequest(prompt=prompt, steps=steps, height=height, width=width, seed=seed, guidance=guidance,
                           extra=extra)


def _print_report(r: dict[str, Any], console: Console) -> None:
    table = Table(title=f"run — {r['model']} on {r['device']}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("load time", fmt_seconds(r["load_seconds"]))
    table.add_row("pinned host memory", fmt_bytes(r["pinned_bytes"]))
    table.add_row("request time", fmt_seconds(r["request_seconds"]))
    for s in r["steps"]:
        table.add_row(f"step {s['step']}", f"{fmt_seconds(s['wall_s'])} (stall {fmt_seconds(s['stall_s'])}, "
                                           f"H2D {fmt_bytes(s['h2d_bytes'])})")
    st = r["staging"]
    table.add_row("host→device transfers", f"{st['h2d_transfers']} ({st['sync_transfers']} synchronous)")
    table.add_row("host→device bytes", fmt_bytes(st["h2d_bytes"]))
    table.add_row("host→device bandwidth (mean)", fmt_rate(st["h2d_bytes_per_s"]))
    table.add_row("peak allocated (torch)", fmt_bytes(r["peak_allocated_bytes"]))
    table.add_row("cache decisions", f"{len(r['cache_decisions'])} ({r['cache_releases']} releases)")
    t = r["telemetry"]
    table.add_row("telemetry samples", str(t["samples"]))
    table.add_row("peak torch reserved / NVML used", f"{fmt_bytes(t['torch_reserved_peak'])} / "
                                                     f"{fmt_bytes(t['nvml_used_peak'])}")
    table.add_row("peak RSS / pinned (host)", f"{fmt_bytes(t['host_rss_peak'])} / {fmt_bytes(t['pinned_peak'])}")
    table.add_row("image", r["output"] or "—")
    console.print(table)
    console.print("\n".join(t["final"]), markup=False, highlight=False)
