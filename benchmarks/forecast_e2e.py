"""Whole-request forecast and `--vram-budget` through the real CLI on a Flux-size checkpoint.

1. profile: one `run` (everything streamed) at the target size; the engine caches the request's
   profile (per-block compute, phase peaks above the weights, the streamer's copy rate);
2. for each --budgets value: `omni-console run --vram-budget B --json`, which plans from that
   profile before load, then measures. Reported per budget: the planner's choice and reasons,
   predicted vs measured device peak (whole request: text encoding, denoise, VAE decode) and median
   step time, and whether the measured peak stayed within the budget.

The checkpoint is the one benchmarks/engine_e2e.py writes (FluxPipeline layout, random bf16
weights, 34 GB). Usage: python -m benchmarks.forecast_e2e --dir /tmp/flux-size --out forecast.json
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

GB = 1e9


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_cli(model: Path, out: Path, args: argparse.Namespace, *flags: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "omni_console.console.cli", "run", "--model", str(model), "--device", args.device,
           "--prompt", "a lighthouse on a cliff at dusk", "--steps", str(args.steps), "--height", str(args.res),
           "--width", str(args.res), "--seed", "3", "--output", str(out), "--overwrite", "--json", *flags]
    log(" ".join(cmd[3:]))
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        log(f"failed ({done.returncode}): {done.stderr[-1500:]}")
        return {"returncode": done.returncode, "stderr": done.stderr[-1500:]}
    return json.loads(done.stdout)


def main() -> None:
    parser = harness.parser(__doc__, out="forecast_e2e.json", device="cuda")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/flux-size"))
    parser.add_argument("--res", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--budgets", type=float, nargs="*", default=[12, 16, 24, 32, 48])
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="omni-profiles-")
    os.environ["OMNI_CONSOLE_CACHE_DIR"] = cache  # a fresh profile cache: the first run measures
    out = Path(tempfile.mkdtemp()) / "out.png"
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "res": args.res, "steps": args.steps}
    first = run_cli(args.dir, out, args)
    report["profile_run"] = {k: first.get(k) for k in ("policy", "forecast_check", "peak_allocated_bytes", "steps")}
    log(f"profile run: check {first.get('forecast_check')}")
    rows = []
    for budget in args.budgets:
        r = run_cli(args.dir, out, args, "--vram-budget", f"{budget}GB")
        if "returncode" in r:
            rows.append({"budget_gb": budget, **r})
            continue
        check = r["forecast_check"]
        peak = r["peak_allocated_bytes"]
        row = {"budget_gb": budget, "policy": r["policy"], "reasons": r["auto_plan"]["reasons"],
               "peak_allocated": peak, "within_budget": None if peak is None else peak <= budget * GB,
               "check": check, "load_s": r["load_seconds"], "steps": [s["wall_s"] for s in r["steps"]]}
        rows.append(row)
        log(f"budget {budget} GB: {r['policy']['placement']} resident={r['policy']['resident_layers']} "
            f"k={r['policy']['prefetch_slots']} comps={r['policy']['dlo_offload_components']}; peak "
            f"{(check['measured_peak_bytes'] or 0) / GB:.2f} GB (pred {(check['predicted_peak_bytes'] or 0) / GB:.2f}, "
            f"err {check['peak_error']}) within {row['within_budget']}; step {check['measured_step_s']:.4f} s "
            f"(pred {check['predicted_step_s']}, err {check['step_error']})")
    report["budgets"] = rows
    harness.write(report, args)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
