"""AllGather DLO on the GPUs of one host, stream by stream: where a rank's step goes, and which knobs move it.

Each rank (spawned, NCCL, as `torchrun` would; NVLink multicast off) builds the same Flux-dev-size
transformer as `dlo_stream.py` (random bf16 weights, seed 0) and measures, every rank at once:
1. pinned host→device bandwidth, each rank alone and all at once; `all_gather_into_tensor` of the
   largest block (1/N per rank); shard copy + gather pipelined on two streams;
2. the resident step (the compute floor) and its output;
3. rank-local DLO (`LayerwiseStreamer`, whole blocks per rank): one GPU's transfer-bound step;
4. AllGather DLO (`AllGatherStreamer`) under each `--variants` entry (shard buffers, ring slots, the
   gathers' stream priority, in-place gathers): step, stall, output == resident output (bit-identical);
5. with `--profile`, one step of each variant under the torch profiler (CUDA activity only), summed
   per kind of GPU work: host→device copies (busy time, bytes, rate), NCCL kernels, compute kernels,
   and the copies' idle time inside the step. Rank 0's traces are kept (gzip) beside `--out`.
Floor per rank: max(compute, shard bytes / all-at-once bandwidth). Ratios printed.

Usage (two GPUs): python -m benchmarks.allgather_stream --gpus 2 --profile --out allgather_stream.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from omni_console.engine.ranks.rank_group import free_port  # noqa: E402
from omni_console.offload.allgather_streamer import AllGatherStreamer, gather_into  # noqa: E402
from omni_console.offload.options import StreamOptions  # noqa: E402
from omni_console.offload.pinned import HostArena, pinned_bytes_held  # noqa: E402
from omni_console.offload.residency import BlockResidency  # noqa: E402
from omni_console.offload.streamer import LayerwiseStreamer  # noqa: E402

from . import harness
from .dlo_stream import BLOCK_ATTRS, PRESETS, build_model, make_inputs

# each: `StreamOptions` fields, and the ring's slots
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "prio": {"comm_priority": -1},
    "buffers3": {"shard_buffers": 3},
    "slots3": {"slots": 3},
    "prio_buffers3": {"comm_priority": -1, "shard_buffers": 3},
    "prio_buffers3_slots3": {"comm_priority": -1, "shard_buffers": 3, "slots": 3},
    "inplace": {"gather_in_place": True},
    "inplace_slots3": {"gather_in_place": True, "slots": 3},
    "prio_inplace_slots3": {"comm_priority": -1, "gather_in_place": True, "slots": 3},
}


def log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def gpu_topology(index: int) -> dict[str, Any]:
    """The GPU's PCI address, NUMA node and local CPUs (sysfs), and this process's CPU affinity."""
    props = torch.cuda.get_device_properties(index)
    domain, bus, dev = (getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    out: dict[str, Any] = {"name": props.name, "affinity_cpus": len(os.sched_getaffinity(0))}
    if bus is None:
        return out
    address = f"{domain or 0:04x}:{bus:02x}:{dev:02x}.0"
    out["pci"] = address
    base = Path("/sys/bus/pci/devices") / address
    for key, name in (("numa_node", "numa_node"), ("local_cpus", "local_cpulist")):
        with contextlib.suppress(OSError):
            out[key] = (base / name).read_text().strip()
    return out


def parse_cpulist(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def timed(fn: Any, repeats: int, *, together: bool = True) -> float:
    """Seconds of `fn()` on the current stream: the median with every rank starting together, or the
    fastest of this rank's own runs (`together=False`)."""
    times = []
    for _ in range(repeats):
        if together:
            dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) if together else min(times)


def link_figures(rank: int, world: int, block_bytes: int) -> dict[str, Any]:
    """Pinned H2D GB/s alone and all at once; gather and pipelined shard copy + gather of one block."""
    nbytes = 2**30
    arena = HostArena(nbytes, pin=True)
    arena.tensor.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    copy = lambda: dev.copy_(arena.tensor, non_blocking=True)  # noqa: E731
    alone = []
    for r in range(world):
        dist.barrier()
        if r == rank:
            alone.append(nbytes / timed(copy, 5, together=False) / 1e9)
        dist.barrier()
    together = nbytes / timed(copy, 5) / 1e9
    arena.close()
    shard = -(-block_bytes // world)
    src = HostArena(shard, pin=True)
    src.tensor.fill_(rank)
    staging = [torch.empty(shard, dtype=torch.uint8, device="cuda") for _ in range(2)]
    gathered = [torch.empty(shard * world, dtype=torch.uint8, device="cuda") for _ in range(2)]
    gather_s = timed(lambda: gather_into(gathered[0], staging[0], None), 10)
    copy_s = timed(lambda: staging[0].copy_(src.tensor, non_blocking=True), 10)
    copy_stream, comm_stream = torch.cuda.Stream(), torch.cuda.Stream()
    blocks = 20

    def pipelined() -> None:
        free: list[Any] = [None, None]
        for i in range(blocks):
            b = i % 2
            if free[b] is not None:
                copy_stream.wait_event(free[b])
            with torch.cuda.stream(copy_stream):
                staging[b].copy_(src.tensor, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(copy_stream)
            comm_stream.wait_event(copied)
            with torch.cuda.stream(comm_stream):
                gather_into(gathered[b], staging[b], None)
                free[b] = torch.cuda.Event()
                free[b].record(comm_stream)
        torch.cuda.current_stream().wait_stream(comm_stream)

    pipelined_s = timed(pipelined, 3) / blocks
    src.close()
    return {"h2d_alone_gbps": alone[0] if alone else None, "h2d_together_gbps": together,
            "block_bytes": block_bytes, "shard_bytes": shard, "gather_ms": gather_s * 1e3,
            "shard_copy_ms": copy_s * 1e3, "pipelined_copy_gather_ms_per_block": pipelined_s * 1e3}


def streamed_model(cfg: dict[str, Any]) -> torch.nn.Module:
    model = build_model(cfg)
    for a in BLOCK_ATTRS:
        getattr(model, a).to("cpu")
    gc.collect()
    torch.cuda.empty_cache()
    return model


def steps(model: torch.nn.Module, inputs: dict[str, Any], iters: int) -> tuple[list[float], torch.Tensor]:
    with torch.no_grad():
        for _ in range(2):
            out = model(**inputs)[0]
        times = []
        for _ in range(iters):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(**inputs)[0]
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    return times, out


def gpu_work(trace: dict[str, Any]) -> dict[str, Any]:
    """One profiled step's GPU work by kind: count, summed and union (busy) seconds, copy bytes and rate."""
    events = [e for e in trace.get("traceEvents", []) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
              and "dur" in e]
    if not events:
        return {}

    def kind(e: dict[str, Any]) -> str:
        name = e.get("name", "")
        if "HtoD" in name:
            return "h2d"
        if name.startswith("nccl"):
            return "nccl"
        return "compute" if e["cat"] == "kernel" else "other"

    start = min(e["ts"] for e in events)
    span = max(e["ts"] + e["dur"] for e in events) - start
    out: dict[str, Any] = {"span_s": span / 1e6}
    for k in ("h2d", "nccl", "compute", "other"):
        mine = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if kind(e) == k)
        busy, cursor = 0.0, None
        for lo, hi in mine:
            if cursor is None or lo > cursor:
                busy += hi - lo
                cursor = hi
            elif hi > cursor:
                busy += hi - cursor
                cursor = hi
        row: dict[str, Any] = {"count": len(mine), "sum_s": sum(hi - lo for lo, hi in mine) / 1e6, "busy_s": busy / 1e6}
        if k == "h2d":
            nbytes = sum(int(e.get("args", {}).get("bytes", 0)) for e in events if kind(e) == k)
            row["bytes"] = nbytes
            row["gbps"] = nbytes / row["sum_s"] / 1e9 if row["sum_s"] else None
            row["idle_in_span_s"] = out["span_s"] - row["busy_s"]
        out[k] = row
    return out


def profiled_step(model: torch.nn.Module, inputs: dict[str, Any], keep: Path | None) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    dist.barrier()
    torch.cuda.synchronize()
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        model(**inputs)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        text = path.read_text()
    if keep is not None:
        with gzip.open(keep, "wt") as f:
            f.write(text)
    return {"wall_s": wall} | gpu_work(json.loads(text))


def run_rank(rank: int, world: int, port: int, args: argparse.Namespace, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    topo = gpu_topology(rank)
    if args.bind_numa and "local_cpus" in topo:
        os.sched_setaffinity(0, parse_cpulist(topo["local_cpus"]))
        topo["affinity_cpus"] = len(os.sched_getaffinity(0))
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    report: dict[str, Any] = {"rank": rank, "topology": topo}
    try:
        cfg = PRESETS[args.preset]
        model = build_model(cfg)
        inputs = make_inputs(cfg, args.res)
        blocks = [b for a in BLOCK_ATTRS for b in getattr(model, a)]
        sizes = [sum(p.numel() * p.element_size() for p in b.parameters()) for b in blocks]
        report["link"] = link_figures(rank, world, max(sizes))
        log(rank, f"link: {report['link']}")
        times, reference = steps(model, inputs, args.iters)
        report["resident"] = {"step_s": statistics.median(times), "times": times, "block_bytes": sum(sizes)}
        log(rank, f"resident step {report['resident']['step_s']:.4f} s")
        if args.profile:
            report["resident"]["profile"] = profiled_step(model, inputs, None)
        del model, blocks
        gc.collect()
        torch.cuda.empty_cache()
        keep = Path(args.out).with_suffix("") if rank == 0 else None
        runs: dict[str, Any] = {}
        for name in ["rank_local", *args.variants]:
            knobs = dict(VARIANTS.get(name, {}))
            slots = knobs.pop("slots", 2)
            model = streamed_model(cfg)
            lists = [(a, list(getattr(model, a))) for a in BLOCK_ATTRS]
            residency = BlockResidency.leading(sum(len(m) for _, m in lists), 0, slots)
            pinned_before = pinned_bytes_held()
            t0 = time.perf_counter()
            if name == "rank_local":
                streamer: LayerwiseStreamer = LayerwiseStreamer(lists, "cuda", residency=residency)
            else:
                streamer = AllGatherStreamer(lists, "cuda", residency=residency, group=None,
                                             stream_options=StreamOptions(**knobs))
            streamer.attach()
            attach_s = time.perf_counter() - t0
            times, out = steps(model, inputs, args.iters)
            stats = streamer.take_step_stats()
            row: dict[str, Any] = {
                "knobs": VARIANTS.get(name, {}), "attach_s": attach_s, "step_s": statistics.median(times),
                "times": times, "stall_s_per_step": stats.stall_s / (args.iters + 2),
                "h2d_bytes_per_step": stats.h2d_bytes / (args.iters + 2),
                "pinned_bytes": pinned_bytes_held() - pinned_before, "streamed_bytes": streamer.streamed_bytes,
                "identical_to_resident": bool(torch.equal(out, reference)),
            }
            if args.profile:
                trace = Path(f"{keep}-{name}.trace.json.gz") if keep is not None else None
                row["profile"] = profiled_step(model, inputs, trace)
            runs[name] = row
            log(rank, f"{name}: step {row['step_s']:.4f} s, stall {row['stall_s_per_step']:.4f} s/step, "
                      f"identical {row['identical_to_resident']}, attach {attach_s:.1f} s"
                      + (f", h2d busy {row['profile']['h2d']['busy_s']:.4f} s of {row['profile']['span_s']:.4f}"
                         if args.profile and "h2d" in row.get("profile", {}) else ""))
            streamer.detach()
            del streamer, model, lists
            gc.collect()
            torch.cuda.empty_cache()
        report["runs"] = runs
    except Exception as e:
        report["error"] = f"{type(e).__name__}: {e}"
        raise  # spawn then stops the other ranks (they would wait in a collective)
    finally:
        results[rank] = report
        dist.destroy_process_group()


def summarise(ranks: list[dict[str, Any]], world: int) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for r in ranks:
        if "runs" not in r:
            continue
        compute = r["resident"]["step_s"]
        bw = r["link"]["h2d_together_gbps"] * 1e9
        shard_floor = r["resident"]["block_bytes"] / world / bw
        floor = max(compute, shard_floor)
        rows = {}
        for name, run in r["runs"].items():
            row = {"step_s": run["step_s"], "identical": run["identical_to_resident"]}
            if name != "rank_local":
                row["step_over_floor"] = run["step_s"] / floor
                row["step_over_rank_local"] = run["step_s"] / r["runs"]["rank_local"]["step_s"]
            prof = run.get("profile", {})
            if "h2d" in prof:
                row["h2d_busy_s"] = prof["h2d"]["busy_s"]
                row["h2d_gbps"] = prof["h2d"]["gbps"]
                row["nccl_sum_s"] = prof.get("nccl", {}).get("sum_s")
                row["compute_busy_s"] = prof.get("compute", {}).get("busy_s")
            rows[name] = row
        summary[f"rank{r['rank']}"] = {"compute_s": compute, "shard_transfer_s": shard_floor, "floor_s": floor,
                                        "runs": rows}
    return summary


def main() -> None:
    parser = harness.parser(__doc__, out="allgather_stream.json", iters=5)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="flux-dev")
    parser.add_argument("--res", type=int, default=1024)
    parser.add_argument("--variants", type=lambda s: s.split(","), default=["default"],
                        help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--bind-numa", action="store_true", help="each rank on its GPU's local CPUs (sysfs)")
    args = parser.parse_args()
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants: {', '.join(unknown)}")
    if torch.cuda.device_count() < args.gpus:
        parser.error(f"{args.gpus} GPUs asked for, {torch.cuda.device_count()} visible")
    manager = mp.Manager()
    results = manager.dict()
    try:
        mp.spawn(run_rank, args=(args.gpus, free_port(), args, results), nprocs=args.gpus, join=True)
    except Exception as e:  # noqa: BLE001 - what the ranks measured before it is still written
        print(f"a rank failed: {e}", flush=True)
    ranks = [results[r] for r in range(args.gpus) if r in results]
    import diffusers

    report = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "diffusers": diffusers.__version__,
              "nccl": ".".join(map(str, torch.cuda.nccl.version())), "gpus": args.gpus, "preset": args.preset,
              "res": args.res, "iters": args.iters, "bind_numa": args.bind_numa, "ranks": ranks,
              "summary": summarise(ranks, args.gpus)}
    harness.write(report, args)
    print(json.dumps(report["summary"], indent=1), flush=True)


if __name__ == "__main__":
    main()
