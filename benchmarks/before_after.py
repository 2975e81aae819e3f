"""The same `run` through two installs of the tool, alternated in one process: did a change move the step or
the time to ready?

Issue 36 moved `run`'s sequence from the console into the engine's request service; it asks that a
transfer-bound DLO step and the time to ready stay within ±2 % of before. Both installs run the same CLI
command (`run --json`, every DiT block streamed unless the flags say otherwise), alternated A, B, A, B, ... so
that the page cache and the card's clocks treat them alike; each install keeps a cache directory of its own
(XDG_CACHE_HOME) so that neither learns from the other's profile. The first run of each is a warm-up (the page
cache, the allocator's first touch), not counted. Printed: per install the median steady step (every step
after the first of a request) and the median `load_seconds` (time to ready), then the ratios B / A.

    python -m benchmarks.before_after --site-a /tmp/site_before --site-b /tmp/site_after \
        --out before_after.json -- --model /tmp/flux-size --height 1024 --width 1024 --steps 4 \
        --resident-layers 0 --prompt "a red fox" --seed 3

Everything after `--` goes to `run` (add `--device cuda:0`; `--output` and `--json` are added here). Each
site holds the tool alone; the libraries come from the PYTHONPATH this runs with (gpu_run.sh `before-after`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import harness

CLI = ("-c", "import sys; from omni_console.console.cli import main; sys.exit(main())")


def one_run(site: Path, cache: Path, out_dir: Path, run_args: list[str], n: int, timeout: float) -> dict[str, Any]:
    """One `run --json` with `site` first on the import path; its report's load time and step times."""
    path = os.pathsep.join(x for x in (str(site), os.environ.get("PYTHONPATH", "")) if x)
    env = {**os.environ, "PYTHONPATH": path, "XDG_CACHE_HOME": str(cache)}
    out = out_dir / f"out-{n}.png"
    argv = [sys.executable, *CLI, "run", *run_args, "--json", "--output", str(out), "--overwrite"]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        return {"exit": done.returncode, "wall_s": wall, "error": (done.stderr or done.stdout).strip()[-400:]}
    report = json.loads(done.stdout)
    steps = [s["wall_s"] for s in report.get("steps", [])]
    return {"exit": 0, "wall_s": wall, "load_s": report.get("load_seconds"), "steps_s": steps,
            "steady_step_s": statistics.median(steps[1:]) if len(steps) > 1 else None}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs[1:] if r.get("exit") == 0]  # the first is the warm-up
    steps = [r["steady_step_s"] for r in ok if r.get("steady_step_s") is not None]
    loads = [r["load_s"] for r in ok if r.get("load_s") is not None]
    return {"runs": len(ok), "step_s": statistics.median(steps) if steps else None,
            "load_s": statistics.median(loads) if loads else None,
            "step_spread": (max(steps) - min(steps)) / statistics.median(steps) if len(steps) > 1 else None}


def main() -> int:
    argv = sys.argv[1:]
    run_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--site-a", type=Path, required=True, help="the install before (a pip --target folder)")
    p.add_argument("--site-b", type=Path, required=True, help="the install after")
    p.add_argument("--repeats", type=int, default=3, help="counted runs of each, after one warm-up each")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds for one run")
    p.add_argument("--deadline-s", type=float, default=520.0, help="stop starting runs after this many seconds")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(own)
    began = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for n in range(args.repeats + 1):
            for key, site in (("a", args.site_a), ("b", args.site_b)):
                if time.perf_counter() - began > args.deadline_s:
                    break
                r = one_run(site, root / f"cache-{key}", root, run_args, n, args.timeout)
                runs[key].append(r)
                print(f"[{time.strftime('%H:%M:%S')}] {key} run {n}: exit {r['exit']}, load "
                      f"{r.get('load_s')}, steady step {r.get('steady_step_s')}", flush=True)
    a, b = summary(runs["a"]), summary(runs["b"])
    ratios = {"step_b_over_a": round(b["step_s"] / a["step_s"], 4) if a["step_s"] and b["step_s"] else None,
              "load_b_over_a": round(b["load_s"] / a["load_s"], 4) if a["load_s"] and b["load_s"] else None}
    doc = {"run_args": run_args, "site_a": str(args.site_a), "site_b": str(args.site_b), "a": a, "b": b,
           "ratios": ratios, "runs": runs, "environment": harness.environment()}
    args.out.write_text(json.dumps(doc, indent=1))
    for k, v in ratios.items():
        print(f"{k}: {v}")
    print(f"a: {a}\nb: {b}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
