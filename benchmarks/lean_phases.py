"""Lean phases on the Wan2.1-14B-size pipeline (81x480x832): each phase's peak plain vs lean, and the
`--vram-budget` planner's choice on small budgets.

Writes the checkpoint as `video_e2e.py` does (random bf16 weights, UMT5-XXL-size encoder, the real Wan
VAE in float32) to --dir once, then runs the real CLI (`run --json`, every DiT block streamed):
1. plain: every encoder/VAE staged, no lean phase (also records the request's profile);
2. lean: `--stream-encoders on --vae-tiling on`;
3. each `--vram-budget` in --budgets (the planner reads the profile of run 1).
For each: text-encoding / denoise / VAE-decode seconds, the VAE decode peak, the request's peak
allocated bytes, the step times, the lean lines and the policy. The figures calibrate the cost
model in engine/planning/lean.py (tiled decode peak and time, the streamed encoder's stage).

    python3 -m benchmarks.lean_phases --dir /tmp/wan-size --out lean_phases.json [--steps 3] \
        [--budgets 8GB 12GB 16GB]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .video_e2e import log, write_checkpoint


def run_cli(model: Path, out_dir: Path, name: str, extra: list[str], args: argparse.Namespace) -> dict[str, Any]:
    output = out_dir / f"wan-lean-{name}.mp4"
    cmd = [sys.executable, "-m", "omni_console.console.cli", "run", "--model", str(model), "--device", "cuda",
           "--prompt", "a red fox running through snow", "--steps", str(args.steps), "--frames", str(args.frames),
           "--height", str(args.height), "--width", str(args.width), "--guidance", "1.0", "--seed", "3",
           "--output", str(output), "--overwrite", "--json", *extra]
    log(" ".join(cmd[2:]))
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        log(f"{name} exited {done.returncode}: {done.stderr.strip()[-1000:]}")
        return {"returncode": done.returncode, "stderr": done.stderr[-2000:], "process_wall_s": wall}
    report = json.loads(done.stdout)
    steps = [s["wall_s"] for s in report.get("steps", [])]
    summary = {
        "process_wall_s": wall, "phases_s": report.get("phases"),
        "vae_decode_peak_bytes": report.get("vae_decode_peak_bytes"),
        "peak_allocated_bytes": report.get("peak_allocated_bytes"),
        "steady_step_s": statistics.median(steps[1:]) if len(steps) > 1 else (steps[0] if steps else None),
        "lean_phases": report.get("lean_phases"), "policy": report.get("policy"),
        "auto_plan": report.get("auto_plan"), "forecast_check": report.get("forecast_check"),
        "telemetry": report.get("telemetry"),
    }
    peak = summary["peak_allocated_bytes"]
    log(f"{name}: phases {summary['phases_s']}, decode peak {summary['vae_decode_peak_bytes']}, peak {peak}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/wan-size"))
    parser.add_argument("--out", default="lean_phases.json")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--budgets", nargs="*", default=["8GB", "12GB", "16GB"])
    args = parser.parse_args()
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "date": time.strftime("%Y-%m-%d"), "args": {k: str(v) for k, v in vars(args).items()}}
    if not (args.dir / "model_index.json").exists():
        write_checkpoint(args.dir)
    out_dir = Path(args.out).resolve().parent
    report["plain"] = run_cli(args.dir, out_dir, "plain", ["--stream-encoders", "off", "--vae-tiling", "off"], args)
    report["lean"] = run_cli(args.dir, out_dir, "lean", ["--stream-encoders", "on", "--vae-tiling", "on"], args)
    for budget in args.budgets:
        report[f"budget_{budget}"] = run_cli(args.dir, out_dir, f"budget-{budget}", ["--vram-budget", budget], args)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
