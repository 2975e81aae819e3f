"""The same `run` through two installs of the tool, alternated in one process: did a change move the step or
the time to ready, or is the difference noise?

Issue 36 moved `run`'s sequence from the console into the engine's request service; it asks that a
transfer-bound DLO step and the time to ready stay within ±2 % of before. Both installs run the same CLI
command (`run --json`, every DiT block streamed unless the flags say otherwise). Runs go in rounds, A B then
B A (ABBA), so that a drift of the machine (the page cache filling, the card's clocks, a neighbour's load)
falls on both alike, with `--settle-s` between runs (the previous process's pinned memory and device context
given back before the next load starts); each install keeps a cache directory of its own (XDG_CACHE_HOME)
so that neither learns from the other's profile or history. The first run of each is a warm-up (the page
cache, the allocator's first touch), not counted; then `--runs N` counted runs of each (default 4: ten runs in all;
a Flux-size run took 24-29 s on an H100 at 4 steps, so about 5 minutes with the rests).

Printed per install: every counted run's `load_seconds` (time to ready) and steady step (the median of a
request's steps after its first), their median, range and spread ((max - min) / median); then per figure the
ratio B / A of the medians and the range of the ratios of the rounds' pairs. A difference is called out only
when it is larger than each install's own spread (the ranges do not overlap); otherwise it is "within noise".
The load's phases and milestones (`load_phases`, `load_milestones` in the report) are compared median against
median, so a regression says where in the load it lies.

    python -m benchmarks.before_after --site-a /tmp/site_before --site-b /tmp/site_after --runs 4 \
        --out before_after.json -- --model /tmp/flux-size --height 1024 --width 1024 --steps 2 \
        --resident-layers 0 --prompt "a red fox" --seed 3

Everything after `--` goes to `run` (add `--device cuda:0`; `--output` and `--json` are added here). Each
site holds the tool alone (a `pip install --target` folder, or a folder with an `omni_console/` of links to a
checkout's engine, console, offload and themes); the libraries come from the PYTHONPATH this runs with
(gpu_run.sh `before-after`).
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
    """One `run --json` with `site` first on the import path; its report's load time, phases and step times."""
    path = os.pathsep.join(x for x in (str(site), os.environ.get("PYTHONPATH", "")) if x)
    # its own cache, also where OMNI_CONSOLE_CACHE_DIR named another (that would win over XDG_CACHE_HOME)
    env = {**os.environ, "PYTHONPATH": path, "XDG_CACHE_HOME": str(cache), "OMNI_CONSOLE_CACHE_DIR": str(cache)}
    out = out_dir / f"out-{n}.png"
    argv = [sys.executable, *CLI, "run", *run_args, "--json", "--output", str(out), "--overwrite"]
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"exit": None, "wall_s": time.perf_counter() - started, "error": f"timed out after {timeout:g} s"}
    wall = time.perf_counter() - started
    if done.returncode != 0:
        return {"exit": done.returncode, "wall_s": wall, "error": (done.stderr or done.stdout).strip()[-400:]}
    report = json.loads(done.stdout)
    steps = [s["wall_s"] for s in report.get("steps", [])]
    return {"exit": 0, "wall_s": wall, "load_s": report.get("load_seconds"), "steps_s": steps,
            "steady_step_s": statistics.median(steps[1:]) if len(steps) > 1 else None,
            "load_phases": report.get("load_phases") or {}, "load_milestones": report.get("load_milestones") or {}}


def figures(values: list[float]) -> dict[str, Any] | None:
    """A figure's counted runs: each, their median, range and spread ((max - min) / median); None: none ran."""
    if not values:
        return None
    median = statistics.median(values)
    return {"each": [round(v, 4) for v in values], "median": median, "min": min(values), "max": max(values),
            "spread": (max(values) - min(values)) / median if median else None}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One install's counted runs (every run after its warm-up that exited 0): load, steady step, phases."""
    ok = [r for r in runs[1:] if r.get("exit") == 0]
    out: dict[str, Any] = {
        "runs": len(ok), "failed": sum(1 for r in runs[1:] if r.get("exit") != 0),
        "load_s": figures([r["load_s"] for r in ok if r.get("load_s") is not None]),
        "step_s": figures([r["steady_step_s"] for r in ok if r.get("steady_step_s") is not None]),
    }
    for part in ("load_phases", "load_milestones"):
        names = sorted({k for r in ok for k in r.get(part, {})})
        out[part] = {k: statistics.median(r[part][k] for r in ok if k in r.get(part, {})) for k in names}
    return out


def compare(a: dict[str, Any] | None, b: dict[str, Any] | None, pairs: list[tuple[float, float]]
            ) -> dict[str, Any] | None:
    """B against A for one figure: the ratio of the medians, the range of the rounds' pair ratios, and whether
    the difference is larger than the noise (B's runs all above A's, or all below: the ranges do not overlap)."""
    if a is None or b is None or not a["median"]:
        return None
    ratios = [y / x for x, y in pairs if x]
    if b["min"] > a["max"]:
        verdict = "slower beyond the noise"
    elif b["max"] < a["min"]:
        verdict = "faster beyond the noise"
    else:
        verdict = "within noise"
    return {"b_over_a": round(b["median"] / a["median"], 4),
            "pair_ratios": [round(r, 4) for r in ratios], "pair_min": round(min(ratios), 4) if ratios else None,
            "pair_max": round(max(ratios), 4) if ratios else None, "verdict": verdict}


def paired(runs: dict[str, list[dict[str, Any]]], key: str) -> list[tuple[float, float]]:
    """(A, B) of each counted round where both ran and reported `key`."""
    out = []
    for ra, rb in zip(runs["a"][1:], runs["b"][1:], strict=False):
        if ra.get(key) is not None and rb.get(key) is not None:
            out.append((ra[key], rb[key]))
    return out


def report_lines(doc: dict[str, Any]) -> list[str]:
    """What the operator reads: each install's runs, the ratios and the verdicts, then the load's parts."""
    lines = []
    for figure, label in (("load_s", "time to ready (load_seconds)"), ("step_s", "steady step")):
        lines.append(f"{label}:")
        for key in ("a", "b"):
            f = doc[key][figure]
            lines.append(f"  {key}: none counted" if f is None else
                         f"  {key}: median {f['median']:.3f} s, range {f['min']:.3f}-{f['max']:.3f} s, spread "
                         f"{f['spread'] * 100:.1f} %, runs {', '.join(f'{v:.3f}' for v in f['each'])}")
        c = doc["compare"][figure]
        if c is not None:
            pairs = f", rounds {c['pair_min']}-{c['pair_max']}" if c["pair_min"] is not None else ""
            lines.append(f"  b/a {c['b_over_a']}{pairs}: {c['verdict']}")
    for part in ("load_phases", "load_milestones"):
        names = [k for k in doc["a"][part] if k in doc["b"][part]]
        if names:
            lines.append(f"{part} (median s, a -> b):")
            lines.extend(f"  {k}: {doc['a'][part][k]:.3f} -> {doc['b'][part][k]:.3f} "
                         f"({doc['b'][part][k] - doc['a'][part][k]:+.3f})" for k in names)
    return lines


def main() -> int:
    argv = sys.argv[1:]
    run_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--site-a", type=Path, required=True, help="the install before (a pip --target folder)")
    p.add_argument("--site-b", type=Path, required=True, help="the install after")
    p.add_argument("--runs", type=int, default=4, help="counted runs of each, after one warm-up each (default 4)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds for one run")
    p.add_argument("--deadline-s", type=float, default=300.0,
                   help="start no round after this many seconds (a round is one run of each; default 300)")
    p.add_argument("--settle-s", type=float, default=3.0, help="seconds of rest after each run (default 3)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(own)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    began = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    sites = {"a": args.site_a, "b": args.site_b}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for n in range(args.runs + 1):
            if time.perf_counter() - began > args.deadline_s:
                print(f"deadline: {n - 1} counted rounds of {args.runs}", flush=True)
                break
            for key in ("a", "b") if n % 2 == 0 else ("b", "a"):  # ABBA: a drift falls on both alike
                r = one_run(sites[key], root / f"cache-{key}", root, run_args, n, args.timeout)
                runs[key].append(r)
                print(f"[{time.strftime('%H:%M:%S')}] {key} run {n}{' (warm-up)' if n == 0 else ''}: exit "
                      f"{r['exit']}, load {r.get('load_s')}, steady step {r.get('steady_step_s')}"
                      + (f": {r['error']}" if r.get("error") else ""), flush=True)
                time.sleep(args.settle_s)
    a, b = summary(runs["a"]), summary(runs["b"])
    doc = {"run_args": run_args, "site_a": str(args.site_a), "site_b": str(args.site_b), "a": a, "b": b,
           "compare": {"load_s": compare(a["load_s"], b["load_s"], paired(runs, "load_s")),
                       "step_s": compare(a["step_s"], b["step_s"], paired(runs, "steady_step_s"))},
           "runs": runs, "environment": harness.environment()}
    args.out.write_text(json.dumps(doc, indent=1))
    print("\n".join(report_lines(doc)))
    return 0 if a["runs"] and b["runs"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
