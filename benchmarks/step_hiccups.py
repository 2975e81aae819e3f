"""Where a slow step's time went: the same `run --json`, N times back to back, each watched from inside.

A transfer-bound Flux-size step takes 0.42 s on an H100, and now and then one takes 0.71-0.76 s (issue 36's
before/after call, 2026-12-07: the second step of two of the four runs after the request service, none of the
runs before it). The report gives each step's wall time, exposed stall and synchronous fetches; what it
cannot give is what else the process did meanwhile. Each run here goes through a small wrapper that records,
on the run's own clock (`time.perf_counter`):

- every full (generation 2) garbage collection: start, duration, the thread that triggered it;
- every stretch over `--gil-ms` in which a 1 ms sleeper thread could not get the interpreter back (another
  thread held the GIL: a collection, a long call that does not release it);
- every step's end (`StepClock.on_step_end`), so each step's window is [end - wall_s, end].

Printed per step: wall, stall, synchronous fetches, H2D bytes, and the collections and GIL holds inside its
window. `run` `gc.freeze()`s what exists after its load (engine/service/run_once.py), as the console does;
`--freeze` alternates runs as built with runs whose `gc.freeze` does nothing, to tell what the freeze changes.

    python -m benchmarks.step_hiccups --runs 5 --out hiccups.json -- --model /tmp/flux-size --device cuda:0 \
        --height 1024 --width 1024 --steps 4 --resident-layers 0 --prompt "a red fox" --seed 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import harness

WRAPPER = r"""
import gc, json, os, sys, threading, time
events = {"gc": [], "gil": [], "step_ends": []}
_start = {}
def _gc(phase, info):
    if info["generation"] != 2:
        return
    now = time.perf_counter()
    if phase == "start":
        _start["t"] = now
    elif "t" in _start:
        events["gc"].append([_start.pop("t"), now - 0.0, threading.current_thread().name])
gc.callbacks.append(_gc)
GIL_S = float(os.environ["HICCUP_GIL_MS"]) / 1000.0
def _sleeper():
    while True:
        before = time.perf_counter()
        time.sleep(0.001)
        after = time.perf_counter()
        if after - before > GIL_S:
            events["gil"].append([before, after])
threading.Thread(target=_sleeper, name="hiccup-sleeper", daemon=True).start()
from omni_console.engine.running import runner
_end = runner.StepClock.on_step_end
def on_step_end(self, *args, **kwargs):
    out = _end(self, *args, **kwargs)
    events["step_ends"].append(time.perf_counter())
    return out
runner.StepClock.on_step_end = on_step_end
if os.environ.get("HICCUP_NO_FREEZE") == "1":  # the run as it was before it froze its loaded objects
    gc.freeze = lambda: None
import atexit
atexit.register(lambda: open(os.environ["HICCUP_OUT"], "w").write(json.dumps(events)))
from omni_console.console.cli import main
sys.exit(main(sys.argv[1:]))
"""


def overlap(window: tuple[float, float], spans: list[list[Any]]) -> float:
    """Seconds of `spans` ([start, end, ...]) inside `window`."""
    lo, hi = window
    return sum(max(0.0, min(hi, s[1]) - max(lo, s[0])) for s in spans)


def one_run(run_args: list[str], out_dir: Path, n: int, freeze: bool, gil_ms: float, timeout: float
            ) -> dict[str, Any]:
    events_path = out_dir / f"events-{n}.json"
    env = {**os.environ, "HICCUP_OUT": str(events_path), "HICCUP_GIL_MS": str(gil_ms),
           "HICCUP_NO_FREEZE": "0" if freeze else "1", "XDG_CACHE_HOME": str(out_dir / "cache"),
           "OMNI_CONSOLE_CACHE_DIR": str(out_dir / "cache")}
    argv = [sys.executable, "-c", WRAPPER, "run", *run_args, "--json", "--output", str(out_dir / f"o-{n}.png"),
            "--overwrite"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        return {"exit": done.returncode, "error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    report = json.loads(done.stdout)
    events = json.loads(events_path.read_text()) if events_path.exists() else {"gc": [], "gil": [], "step_ends": []}
    steps = []
    for step, end in zip(report["steps"], events["step_ends"], strict=False):
        window = (end - step["wall_s"], end)
        steps.append({**{k: step.get(k) for k in ("step", "wall_s", "stall_s", "sync_fetches", "h2d_bytes")},
                      "gc_s": overlap(window, events["gc"]), "gil_held_s": overlap(window, events["gil"]),
                      "gc_threads": sorted({g[2] for g in events["gc"] if overlap(window, [g]) > 0})})
    return {"exit": 0, "freeze": freeze, "load_s": report.get("load_seconds"), "steps": steps,
            "gc_total": len(events["gc"]), "gil_holds": len(events["gil"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="runs of each kind (default 5)")
    p.add_argument("--freeze", action="store_true",
                   help="alternate runs as built with runs whose gc.freeze() is a no-op")
    p.add_argument("--gil-ms", type=float, default=20.0, help="a sleeper's overshoot counted as a GIL hold (ms)")
    p.add_argument("--timeout", type=float, default=240.0)
    p.add_argument("--deadline-s", type=float, default=400.0, help="no new run after this many seconds")
    p.add_argument("--out", type=Path, required=True)
    args, run_args = p.parse_known_args(argv)
    run_args = [a for a in run_args if a != "--"]
    started = time.perf_counter()
    kinds = [False, True] if args.freeze else [True]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hiccups-") as tmp:
        for _ in range(args.runs):
            for freeze in kinds:  # alternated, so a drift of the machine falls on both
                if time.perf_counter() - started > args.deadline_s:
                    break
                run = one_run(run_args, Path(tmp), len(runs), freeze, args.gil_ms, args.timeout)
                runs.append(run)
                for s in run.get("steps", []):
                    print(f"run {len(runs) - 1} freeze={int(freeze)} step {s['step']}: wall {s['wall_s']:.3f} s "
                          f"stall {s['stall_s']:.3f} s sync {s['sync_fetches']} gc {s['gc_s'] * 1000:.0f} ms "
                          f"gil {s['gil_held_s'] * 1000:.0f} ms {s['gc_threads']}", flush=True)
                if run.get("exit"):
                    print(f"run {len(runs) - 1}: exit {run['exit']} {run.get('error')}", flush=True)
    doc = {"run_args": run_args, "runs": runs, "environment": harness.environment()}
    args.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
