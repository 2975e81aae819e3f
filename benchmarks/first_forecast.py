"""The forecast of a first request (no profile: estimated from the configs) against what it measures.

For each model directory (written by `engine_e2e.py --write-only` for Flux-size, `video_e2e.py` for
Wan-14B-size), in a fresh profile cache: `plan --json` with no size flags (the size it assumes),
`plan --json` at the request's size, then `run --json` twice — the first run's `forecast_check` is
the estimate from config vs measured, the second's the cached profile vs measured.

    python3 -m benchmarks.first_forecast --flux /tmp/flux-size --wan /tmp/wan-size --out first_forecast.json
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

REQUESTS = {  # the sizes of the recorded runs; guidance left to the pipeline (Wan: 5.0, two forwards a step)
    "flux": ["--height", "1024", "--width", "1024", "--steps", "6"],
    "wan": ["--frames", "81", "--height", "480", "--width", "832", "--steps", "4"],
}


def cli(args: list[str], cache: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "omni_console.console.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "OMNI_CONSOLE_CACHE_DIR": str(cache)})
    if done.returncode != 0:
        return {"returncode": done.returncode, "stderr": done.stderr[-2000:]}
    return json.loads(done.stdout)


def measure(name: str, model: Path, out_dir: Path) -> dict[str, Any]:
    cache = Path(tempfile.mkdtemp(prefix=f"first-forecast-{name}-"))
    size = REQUESTS[name]
    plan_flags = size[:-2]  # without --steps
    result: dict[str, Any] = {"model": str(model), "cache": str(cache)}
    default = cli(["plan", "--model", str(model), "--device", "cuda", "--json"], cache)
    result["plan_default_size"] = default.get("request_forecast", default)
    sized = cli(["plan", "--model", str(model), "--device", "cuda", "--json", *plan_flags], cache)
    result["plan"] = sized.get("request_forecast", sized)
    for i in (1, 2):
        report = cli(["run", "--model", str(model), "--device", "cuda", "--json", *size, "--seed", "1",
                      "--output", str(out_dir / f"first-forecast-{name}-{i}.{'mp4' if name == 'wan' else 'png'}"),
                      "--overwrite"], cache)
        result[f"run{i}"] = {k: report.get(k) for k in ("forecast_check", "peak_allocated_bytes", "telemetry",
                                                        "vae_decode_peak_bytes", "returncode", "stderr")}
        check = report.get("forecast_check") or {}
        print(f"[{time.strftime('%H:%M:%S')}] {name} run {i}: peak {check.get('peak_error')} "
              f"({check.get('peak_basis')}), step {check.get('step_error')} ({check.get('step_basis')})", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flux", type=Path, default=Path("/tmp/flux-size"))
    parser.add_argument("--wan", type=Path, default=Path("/tmp/wan-size"))
    parser.add_argument("--out", default="first_forecast.json")
    args = parser.parse_args()
    out_dir = Path(args.out).resolve().parent
    report = {"date": time.strftime("%Y-%m-%d")}
    for name, model in (("flux", args.flux), ("wan", args.wan)):
        if (model / "model_index.json").exists():
            report[name] = measure(name, model, out_dir)
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
