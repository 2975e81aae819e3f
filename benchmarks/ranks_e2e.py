"""Several GPUs through the real CLI on the Flux-size checkpoint: one GPU vs two ranks (AllGather and
rank-local), data-parallel (one seed per rank).

Runs, each `omni-console run --json` at --res, --steps, everything streamed:
1. `--mode resident` on one GPU: the compute-bound step (the floor's compute term);
2. one GPU, DLO: the transfer-bound step and the time of one request;
3. `--gpus 2` (AllGather): two requests at once; per-rank step, block host bytes;
4. `--gpus 2 --dlo-no-use-allgather`: the same with whole blocks per rank;
5. a guided request (negative prompt, true CFG 2.0) on one GPU and with `--gpus 2 --parallel cfg`.
Ratios printed: two-rank wall / one-GPU request (target <= 0.55), block host bytes per rank / half
the streamed bytes (target <= 1.02), per-rank step / max(compute, one-GPU DLO step / 2).

`run` serves one request per process, so each of those requests also pays the process's one-time CUDA
warm-up. With `--warm N`, the engine API (as the console drives it) loads once and serves N requests,
on one GPU and on two AllGather ranks (data- and CFG-parallel): the steady requests are what an
operator sending one after another sees, and what a throughput figure means.

Usage: python -m benchmarks.ranks_e2e --dir /tmp/flux-size --out ranks_e2e.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from . import harness
from .forecast_e2e import run_cli


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def steady(steps: list[dict[str, Any]]) -> float | None:
    walls = [s["wall_s"] for s in steps[1:]] or [s["wall_s"] for s in steps]
    return statistics.median(walls) if walls else None


def warm_requests(engine: Any, requests: int, res: int, steps: int, **request: Any) -> dict[str, Any]:
    """Load once under the default policy, then `requests` requests one after another: seconds, phases
    and median step of each."""
    from omni_console.engine.running.runner import GenerateRequest
    from omni_console.offload.policy import OffloadPolicy

    try:
        load = engine.load(OffloadPolicy())
        rows = []
        for _ in range(requests):
            result = engine.generate(GenerateRequest(prompt="a lighthouse on a cliff at dusk", steps=steps, height=res,
                                                     width=res, seed=3, **request))
            walls = [s.wall_s for s in result.steps[1:]] or [s.wall_s for s in result.steps]
            rows.append({"seconds": result.seconds, "phases": dict(result.phases),
                         "step_s_median": statistics.median(walls) if walls else None})
        return {"load_seconds": load.seconds, "requests": rows}
    finally:
        engine.close()


def warm_section(args: argparse.Namespace) -> dict[str, Any]:
    """One GPU, then two AllGather ranks data-parallel, then a guided request both ways, each warm."""
    from omni_console.engine.engine import Engine
    from omni_console.engine.ranks.group_engine import GroupEngine
    from omni_console.engine.ranks.rank_layout import RankLayout

    guided = {"negative_prompt": "blurry", "params": {"true_cfg_scale": 2.0}}
    runs: dict[str, Any] = {}
    for name, make, request in (
        ("single", lambda: Engine(args.dir, device=args.device), {}),
        ("dp", lambda: GroupEngine(args.dir, RankLayout(2), device_kind=args.device), {}),
        ("cfg_single", lambda: Engine(args.dir, device=args.device), guided),
        ("cfg", lambda: GroupEngine(args.dir, RankLayout(2, parallel="cfg"), device_kind=args.device), guided),
    ):
        if args.one_gpu and name in ("dp", "cfg"):
            continue
        log(f"warm: {name}")
        runs[name] = warm_requests(make(), args.warm, args.res, args.steps, **request)
        log(f"warm {name}: " + ", ".join(f"{r['seconds']:.2f} s" for r in runs[name]["requests"]))
    if args.one_gpu:
        return runs
    last = {name: run["requests"][-1]["seconds"] for name, run in runs.items()}
    runs["dp_over_single"] = last["dp"] / last["single"]
    runs["cfg_over_single"] = last["cfg"] / last["cfg_single"]
    log(f"warm: data-parallel {runs['dp_over_single']:.3f}x, CFG-parallel {runs['cfg_over_single']:.3f}x "
        f"the last one-GPU request")
    return runs


def main() -> None:
    parser = harness.parser(__doc__, out="ranks_e2e.json", device="cuda")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/flux-size"))
    parser.add_argument("--res", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warm", type=int, default=0, help="also N requests per load through the engine API")
    parser.add_argument("--only-warm", action="store_true", help="skip the `run` section")
    parser.add_argument("--one-gpu", action="store_true", help="--warm on one GPU only (the ratios' denominators)")
    args = parser.parse_args()
    if not (args.dir / "model_index.json").exists():
        from engine_e2e import write_checkpoint

        write_checkpoint(args.dir)
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "res": args.res, "steps": args.steps}
    if args.warm:
        report["warm"] = warm_section(args)
        harness.write(report, args)
    if args.only_warm:
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.png"
        resident = run_cli(args.dir, out, args, "--mode", "resident")
        single = run_cli(args.dir, out, args)
        ranks = {name: run_cli(args.dir, out, args, "--gpus", "2", *flags)
                 for name, flags in (("allgather", ()), ("rank_local", ("--dlo-no-use-allgather",)))}
        guided = ("--negative-prompt", "blurry", "--param", "true_cfg_scale=2.0")
        cfg_single = run_cli(args.dir, out, args, *guided)
        cfg_ranks = run_cli(args.dir, out, args, *guided, "--gpus", "2", "--parallel", "cfg")
    report.update(resident=resident, single=single, cfg_single=cfg_single, cfg_ranks=cfg_ranks, **ranks)
    compute, single_step = steady(resident.get("steps", [])), steady(single.get("steps", []))
    one_request = single.get("request_seconds")
    streamed = single.get("forecast", {}).get("streamed_bytes_per_forward")
    log(f"one GPU: resident step {compute}, DLO step {single_step}, request {one_request}")
    summary: dict[str, Any] = {"compute_step_s": compute, "single_dlo_step_s": single_step,
                               "single_request_s": one_request}
    for name, doc in ranks.items():
        if "ranks" not in doc:
            log(f"{name}: failed")
            continue
        rank_steps = [r["step_s_median"] for r in doc["ranks"]]
        host = [r["block_host_bytes"] for r in doc["ranks"]]
        floor = max(compute or 0.0, (single_step or 0.0) / 2) if name == "allgather" else single_step
        row = {"wall_s": doc["wall_seconds"], "wall_over_single_request": doc["wall_seconds"] / one_request,
               "rank_step_s": rank_steps, "step_over_floor": [s / floor for s in rank_steps] if floor else None,
               "block_host_over_half_streamed": [h / (streamed / 2) for h in host] if streamed else None,
               "load_s": [r["load_seconds"] for r in doc["ranks"]]}
        summary[name] = row
        log(f"{name}: 2 requests in {row['wall_s']:.2f} s = {row['wall_over_single_request']:.3f}x one request on one "
            f"GPU; rank steps {rank_steps} vs floor {floor}; block host / half streamed "
            f"{row['block_host_over_half_streamed']}")
    if "ranks" in cfg_ranks and "request_seconds" in cfg_single:
        cfg_wall = cfg_ranks["ranks"][0]["request_seconds"]
        summary["cfg"] = {"single_request_s": cfg_single["request_seconds"], "cfg_request_s": cfg_wall,
                          "latency_ratio": cfg_wall / cfg_single["request_seconds"],
                          "single_step_s": steady(cfg_single.get("steps", [])),
                          "rank_step_s": [r["step_s_median"] for r in cfg_ranks["ranks"]]}
        log(f"CFG-parallel: one guided request {cfg_wall:.2f} s on two ranks vs {cfg_single['request_seconds']:.2f} s "
            f"on one GPU = {summary['cfg']['latency_ratio']:.3f}x")
    report["summary"] = summary
    harness.write(report, args)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
