"""`omni-console run` end to end, as an operator calls it: time to ready and the DLO step through the CLI.

Issue 36 moved `run`'s sequence (open, load, submit, wait, write, report) from the console into the engine's
service; the load and the step must not change (±2 %). This runs `run --json` in a fresh process `--repeats`
times, every DiT block streamed (`--resident-layers 0`: transfer-bound at --res 512 on a Flux-size DiT), and
reads each report: `load_seconds` (time to ready) and the median step `wall_s` after the first step.
`--compare BEFORE.json` (this script's output on the other tree) prints after / before for both.

Usage: python3 -m benchmarks.run_path --model /tmp/flux-size --res 512 --steps 8 --out after.json \
           [--compare before.json]          (CPU check: --device cpu, demo model, --res 64 --steps 3)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def one_run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "omni_console.console.cli", "run", "--device", args.device, "--resident-layers",
           "0", "--prompt", "a lighthouse on a cliff at dusk", "--steps", str(args.steps), "--height", str(args.res),
           "--width", str(args.res), "--seed", "3", "--output", str(out), "--overwrite", "--json",
           *(["--model", str(args.model)] if args.model else [])]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}): {done.stderr[-1500:]}")
    report = json.loads(done.stdout)
    steps = [s["wall_s"] for s in report["steps"]][1:] or [s["wall_s"] for s in report["steps"]]
    return {"load_s": report["load_seconds"], "step_s": statistics.median(steps),
            "stall_s": statistics.median(s["stall_s"] for s in report["steps"]),
            "request_s": report["request_seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="diffusers model dir (default: the demo model)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--res", type=int, default=512)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("run_path.json"))
    parser.add_argument("--compare", type=Path, default=None, help="this script's JSON from the other tree")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            runs.append(one_run(args, Path(tmp) / "o.png"))
            log(f"run {i + 1}: ready in {runs[-1]['load_s']:.3f} s, step {runs[-1]['step_s'] * 1e3:.2f} ms "
                f"(stall {runs[-1]['stall_s'] * 1e3:.2f} ms)")
    summary = {"load_s": statistics.median(r["load_s"] for r in runs),
               "step_s": statistics.median(r["step_s"] for r in runs)}
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
                                    "median": summary}, indent=2))
    print(f"run path: time to ready {summary['load_s']:.3f} s, DLO step {summary['step_s'] * 1e3:.2f} ms "
          f"(medians of {args.repeats})")
    if args.compare:
        before = json.loads(args.compare.read_text())["median"]
        for key, what in (("load_s", "time to ready"), ("step_s", "DLO step")):
            ratio = summary[key] / before[key]
            print(f"{what}: after / before {ratio:.3f} ({'within' if abs(ratio - 1) <= 0.02 else 'OUTSIDE'} ±2 %)")


if __name__ == "__main__":
    main()
