"""Time to ready against its floors, and live re-plan against moved bytes / bandwidth (issue: ready at
the storage limit).

1. Floors on a checkpoint directory's safetensors files (written back and read once first, so the
   page cache is warm and clean), each with the arena on 4 KiB pages and on transparent huge pages:
   - read into fresh host memory with N threads (os.preadv into one buffer; 1 thread unless --quick);
   - cudaHostRegister of the filled buffer, alone, and as 4 ranges registered at once;
   - register first, then read into the registered buffer (unless --quick);
   - read in 2 GB batches with each batch registered on another thread as the next is read;
   - --cold: the N-thread read after `sync; echo 3 > /proc/sys/vm/drop_caches` (root only).
   The floor is the fastest of these, either kind of page.
2. Engine.load of the checkpoint (every block streamed, everything staged) with its phase split
   (read / arrange / register), against the N-thread read + register floor. The model's classes are
   imported first (`Engine.prepare`, timed on its own), as the console does when a model is opened.
   --repeat N: N more loads with each read schedule (READ_SCHEDULES: the DiT's block batches read
   one at a time or all queued at once; each component with its own readers or all on one pool),
   alternating; their medians.
3. Live re-plan on the loaded model (--replan): resident layers 0 -> N -> 0, each against
   1.2 x moved bytes / the pinned host -> device rate measured in the same run + 0.1 s.

Usage: python -m benchmarks.replan_load --dir /tmp/flux-size --threads 16 --replan 28 --repeat 3 --out replan_load.json
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.offload.pinned import HUGE_PAGE, HostArena
from omni_console.offload.policy import build_policy

from . import harness
from .load_timeline import mapping_facts, recording

CHUNK = 64 << 20
# --repeat's read schedules: (batches of DiT blocks queued ahead, None = all; one reader pool for the
# DiT and the other components, whose reads then queue between the DiT's batches)
READ_SCHEDULES: dict[str, tuple[int | None, bool]] = {
    "batch_by_batch": (0, False), "one_ahead": (1, False), "all_queued": (None, False),
    "one_pool_batch_by_batch": (0, True), "one_pool_one_ahead": (1, True), "one_pool_all_queued": (None, True)}

# --variants: `EngineOptions` fields set for a load; "default" sets none
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "dit_empties": {"dit_in_arena": False},  # a DiT's weights in empty tensors of their own
    "small_pages": {"use_huge_pages": False},  # every arena on 4 KiB pages
    # an AllGather rank's load (sharded reads, batches page-locked shard by shard) in a group of one:
    # every byte is its shard, so it reads what one GPU reads, along the ranks' code path
    "allgather_rank": {},
}


def group_of_one() -> Any:
    """A torch.distributed group of this process alone (NCCL on a GPU), made once."""
    import torch.distributed as dist

    from omni_console.engine.ranks.rank_group import free_port

    if not dist.is_initialized():
        port = free_port()
        cuda = torch.cuda.is_available()
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1, **({"device_id": torch.device("cuda", 0)} if cuda else {}))
    return dist.group.WORLD


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def files_of(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.safetensors") if p.is_file())


def read_into(files: list[Path], buffer: np.ndarray, threads: int) -> float:
    """Read every file back to back into `buffer` in CHUNK pieces on `threads` threads; seconds."""
    t0 = time.perf_counter()
    read_range(files, buffer, 0, buffer.nbytes, threads)
    return time.perf_counter() - t0


def floors(files: list[Path], threads: int, cold: bool, quick: bool = False) -> dict[str, Any]:
    """Every floor, with the arena on ordinary 4 KiB pages and on transparent huge pages; the floor is
    the fastest way measured, either kind, to have every byte read and page-locked."""
    total = sum(p.stat().st_size for p in files)
    out: dict[str, Any] = {"bytes": total, "threads": threads}
    if not quick:
        buf = np.empty(total, dtype=np.uint8)
        out["read_1_threads_s"] = read_into(files, buf, 1)
        log(f"read {total / 1e9:.1f} GB with 1 thread: {out['read_1_threads_s']:.2f} s")
        del buf
    candidates = []
    for kind, huge in (("4k", False), ("huge", True)):
        candidates += page_kind_floors(files, total, threads, quick, out, kind, huge)
    if cold:
        drop_page_cache()
        buf = np.empty(total, dtype=np.uint8)
        out["cold_read_s"] = read_into(files, buf, threads)
        del buf
        log(f"cold read: {out['cold_read_s']:.2f} s")
    out["floor_s"] = min(candidates)
    return out


def page_kind_floors(files: list[Path], total: int, threads: int, quick: bool, out: dict[str, Any],
                     kind: str, huge: bool) -> list[float]:
    """The read, register and overlapped floors for one kind of page (`huge`: arenas advised to use huge
    pages); returns the candidate floors."""
    arena = HostArena(total, pin=False, huge_pages=huge)
    out[f"{kind}_read_{threads}_threads_s"] = read_into(files, arena.tensor.numpy(), threads)
    log(f"{kind}: read {total / 1e9:.1f} GB with {threads} threads into fresh memory: "
        f"{out[f'{kind}_read_{threads}_threads_s']:.2f} s (huge pages advised: {arena.huge_pages})")
    if not torch.cuda.is_available():
        arena.close()
        return [out[f"{kind}_read_{threads}_threads_s"]]
    t0 = time.perf_counter()
    arena.pin()
    out[f"{kind}_register_s"] = time.perf_counter() - t0
    arena.close()
    arena = HostArena(total, pin=False, huge_pages=huge)
    read_into(files, arena.tensor.numpy(), threads)
    out[f"{kind}_register_4_threads_s"] = register_in_parallel(arena, 4)
    arena.close()
    read_s = out[f"{kind}_read_{threads}_threads_s"]
    candidates = [read_s + out[f"{kind}_register_s"], read_s + out[f"{kind}_register_4_threads_s"]]
    if not quick:
        t0 = time.perf_counter()
        arena = HostArena(total, pin=True, huge_pages=huge)  # registering fresh memory faults in (zeroes) every page
        out[f"{kind}_register_fresh_s"] = time.perf_counter() - t0
        out[f"{kind}_read_into_registered_s"] = read_into(files, arena.tensor.numpy(), threads)
        arena.close()
        candidates.append(out[f"{kind}_register_fresh_s"] + out[f"{kind}_read_into_registered_s"])
    out[f"{kind}_overlapped_s"] = read_and_register_overlapped(files, total, threads, huge)
    candidates.append(out[f"{kind}_overlapped_s"])
    log(f"{kind}: register filled memory {out[f'{kind}_register_s']:.2f} s (4 threads "
        f"{out[f'{kind}_register_4_threads_s']:.2f} s); register fresh then read "
        f"{out.get(f'{kind}_register_fresh_s', float('nan')):.2f} + "
        f"{out.get(f'{kind}_read_into_registered_s', float('nan')):.2f} s; read with registration overlapped "
        f"{out[f'{kind}_overlapped_s']:.2f} s")
    return candidates


def register_in_parallel(arena: HostArena, threads: int) -> float:
    """Seconds to page-lock a filled arena as `threads` ranges registered at once."""
    step = -(-arena.nbytes // threads // HUGE_PAGE) * HUGE_PAGE
    ranges = [(lo, min(arena.nbytes, lo + step)) for lo in range(0, arena.nbytes, step)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda r: arena.pin_ranges([r]), ranges))
    return time.perf_counter() - t0


def read_and_register_overlapped(files: list[Path], total: int, threads: int, huge: bool = True) -> float:
    """Read 2 GB batches on `threads` threads; each finished batch is registered on another thread."""
    from concurrent.futures import wait

    arena = HostArena(total, pin=False, huge_pages=huge)
    view = arena.tensor.numpy()
    batch = 2 << 30
    t0 = time.perf_counter()
    with ThreadPoolExecutor(1) as registrar:
        futures = []
        for lo in range(0, total, batch):
            hi = min(total, lo + batch)
            read_range(files, view, lo, hi, threads)
            futures.append(registrar.submit(arena.pin_ranges, [(lo, hi)]))
        wait(futures)
    seconds = time.perf_counter() - t0
    arena.close()
    return seconds


def read_range(files: list[Path], view: np.ndarray, lo: int, hi: int, threads: int) -> None:
    """Bytes [lo, hi) of the files laid back to back, into the same place of `view`."""
    jobs, offset = [], 0
    for path in files:
        size = path.stat().st_size
        for start in range(0, size, CHUNK):
            a, b = offset + start, offset + min(size, start + CHUNK)
            if a < hi and b > lo:
                a2, b2 = max(a, lo), min(b, hi)
                jobs.append((path, a2 - offset, b2 - a2, a2))
        offset += size
    mv = memoryview(view)

    def run(job: tuple[Path, int, int, int]) -> None:
        path, start, length, dest = job
        fd = os.open(path, os.O_RDONLY)
        try:
            os.preadv(fd, [mv[dest:dest + length]], start)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, jobs))


def host_facts() -> dict[str, str]:
    """The kernel and its transparent-huge-page settings (what the page-kind figures depend on)."""
    facts = {"kernel": os.uname().release, "cpus": str(os.cpu_count())}
    for name in ("enabled", "defrag"):
        path = Path("/sys/kernel/mm/transparent_hugepage") / name
        facts[f"thp_{name}"] = path.read_text().strip() if path.exists() else "absent"
    return facts


def settle_page_cache(files: list[Path], threads: int) -> None:
    """Write back anything dirty and read every file once, so the floors and loads after this all
    start from the same warm page cache (right after writing, write-back competes with the reads)."""
    subprocess.run(["sync"], check=False)
    total = sum(p.stat().st_size for p in files)
    read_into(files, np.empty(total, dtype=np.uint8), threads)


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=False)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def h2d_rate(nbytes: int = 4 << 30) -> float:
    """Pinned host -> device copy rate (bytes/s), best of three: the bandwidth a re-plan moves at."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    del src, dst
    torch.cuda.empty_cache()
    return nbytes / best


def timed_load(path: Path, device: str, live: bool, direct: bool = True, schedule: str | None = None,
               variant: str = "default", sample_s: float = 0.0) -> tuple[Engine, dict[str, Any]]:
    """One `Engine.load`, with its phases, milestones, timeline (`load_timeline`) and the memory map
    before and after; `schedule`: one of READ_SCHEDULES instead of the engine's default; `variant`:
    one of VARIANTS; `sample_s`: where the loading thread was in its first seconds."""
    group = group_of_one() if variant == "allgather_rank" else None
    options = EngineOptions(live_replan=live, direct_read=direct, **VARIANTS[variant])
    if schedule is not None:
        ahead, shared = READ_SCHEDULES[schedule]
        options = replace(options, read_ahead_batches=ahead, share_readers=shared)
    engine = Engine(path, device=device, group=group, options=options)
    prepare_s = engine.prepare()  # the classes' imports: the console does this when the model is opened
    before = mapping_facts()
    with recording(sample_s) as timeline:
        load = engine.load(build_policy({}, 0))
    return engine, {"seconds": load.seconds, "prepare_seconds": prepare_s,
                    "phases": load.phases, "pinned_bytes": load.pinned_bytes,
                    "components": load.components, "dit_read_seconds": load.dit_read_seconds,
                    "milestones": load.milestones, "schedule": schedule or "default", "variant": variant,
                    "streamer": type(engine.placement.streamer).__name__ if engine.placement else None,
                    "maps_before": before, "maps_after": mapping_facts(), "timeline": timeline.summary()}


def peers(path: Path) -> dict[str, Any]:
    """diffusers on the same files: plain from_pretrained().to(cuda), and from_pretrained + group offload."""
    import gc

    from diffusers.hooks import apply_group_offloading

    from omni_console.engine.loading.loader import pipeline_class, quiet_libraries
    from omni_console.engine.model_dir.discovery import discover_model

    quiet_libraries()
    cls = pipeline_class(discover_model(path))
    out: dict[str, Any] = {}
    for name in ("plain_to_cuda", "group_offload_block_level"):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pipe = cls.from_pretrained(str(path), torch_dtype=torch.bfloat16, local_files_only=True)
        if name == "plain_to_cuda":
            pipe.to("cuda")
        else:
            for component in pipe.components.values():
                if isinstance(component, torch.nn.Module):
                    apply_group_offloading(component, onload_device=torch.device("cuda"),
                                           offload_device=torch.device("cpu"), offload_type="block_level",
                                           num_blocks_per_group=1, use_stream=True)
        torch.cuda.synchronize()
        out[name] = time.perf_counter() - t0
        log(f"diffusers {name}: ready in {out[name]:.2f} s")
        del pipe
        gc.collect()
        torch.cuda.empty_cache()
    return out


def _kind(schedule: str, variant: str) -> str:
    return schedule if variant == "default" else f"{schedule}+{variant}"


def main() -> None:
    parser = harness.parser(__doc__, out="replan_load.json", device=harness.AUTO)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 4)
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--replan", type=int, default=None, metavar="N", help="re-plan 0 -> N -> 0 resident layers")
    parser.add_argument("--peers", action="store_true", help="time diffusers on the same files too")
    parser.add_argument("--quick", action="store_true", help="skip the 1-thread read and register-fresh floors")
    parser.add_argument("--repeat", type=int, default=0, metavar="N",
                        help="N more warm loads with each read schedule, alternating")
    parser.add_argument("--schedules", type=lambda v: [x for x in v.split(",") if x], default=list(READ_SCHEDULES),
                        metavar="A,B", help="--repeat's READ_SCHEDULES (default: all)")
    parser.add_argument("--variants", type=lambda v: [x for x in v.split(",") if x], default=["default"],
                        metavar="A,B", help="--repeat's engine VARIANTS (default: default)")
    parser.add_argument("--first-variant", choices=list(VARIANTS), default="default",
                        help="the first load's engine variant (VARIANTS)")
    parser.add_argument("--sample", type=float, default=0.0, metavar="S",
                        help="sample where the first load's thread is during its first S seconds")
    parser.add_argument("--cold-schedules", type=lambda v: [x for x in v.split(",") if x], default=[],
                        metavar="A,B", help="with --cold, a cold load with each of these READ_SCHEDULES too")
    parser.add_argument("--write", choices=["flux", "wan"], help="write the checkpoint to --dir first if missing")
    args = parser.parse_args()
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "dir": str(args.dir), "host": host_facts()}
    if args.write and not (args.dir / "model_index.json").exists():
        if args.write == "wan":
            from benchmarks.video_e2e import write_checkpoint
        else:
            from benchmarks.engine_e2e import write_checkpoint
        write_checkpoint(args.dir)
    settle_page_cache(files_of(args.dir), args.threads)
    report["floors"] = floors(files_of(args.dir), args.threads, args.cold, args.quick)
    floor = report["floors"]["floor_s"]
    engine, report["load"] = timed_load(args.dir, args.device, args.replan is not None, variant=args.first_variant,
                                        sample_s=args.sample)
    report["load"]["over_floor"] = report["load"]["seconds"] / floor
    log(f"classes imported (Engine.prepare, before the load as in the console) in "
        f"{report['load']['prepare_seconds']:.2f} s")
    log(f"Engine.load warm {report['load']['seconds']:.2f} s {report['load']['phases']} = "
        f"{report['load']['over_floor']:.2f}x the floor ({floor:.2f} s); components "
        f"{ {k: round(v, 2) for k, v in report['load']['components'].items()} }, DiT reads "
        f"{report['load']['dit_read_seconds']:.2f} s; milestones "
        f"{ {k: round(v, 2) for k, v in report['load']['milestones'].items()} }; variant {args.first_variant}, maps "
        f"{report['load']['maps_before']} -> {report['load']['maps_after']}; registrations (start, end, GB) "
        f"{report['load']['timeline']['registers']}; loading thread {report['load']['timeline']['loading_thread']}")
    try:
        if args.replan is not None:
            rate = h2d_rate()
            report["h2d_bytes_per_s"] = rate
            log(f"pinned host -> device: {rate / 1e9:.1f} GB/s")
            rows = []
            for layers in (args.replan, 0):
                event = engine.replan(build_policy({}, layers))
                moved = event.copied_bytes + event.ring_bytes
                target = 1.2 * moved / rate + 0.1
                rows.append({"to": layers, "seconds": event.seconds, "copied": event.copied_bytes,
                             "freed": event.freed_bytes, "ring": event.ring_bytes, "target_s": target,
                             "rate": rate})
                log(f"re-plan to {layers}: {event.seconds:.3f} s (target {target:.3f} s) {event.summary}")
            report["replan"] = rows
    finally:
        engine.close()
    if args.repeat:  # more loads, alternating the read schedules: their medians
        kinds = [(name, variant) for name in args.schedules for variant in args.variants]
        runs: dict[str, list[dict[str, Any]]] = {_kind(*k): [] for k in kinds}
        for _ in range(args.repeat):
            for name, variant in kinds:
                engine, run = timed_load(args.dir, args.device, False, schedule=name, variant=variant)
                engine.close()
                runs[_kind(name, variant)].append(run)
                log(f"Engine.load warm ({_kind(name, variant)}): {run['seconds']:.2f} s = "
                    f"{run['seconds'] / floor:.2f}x the floor; milestones "
                    f"{ {k: round(v, 2) for k, v in run['milestones'].items()} }; reads ended "
                    f"{run['timeline']['reads_end_s']}, registering ended {run['timeline']['registers_end_s']} s; "
                    f"maps {run['maps_before']} -> {run['maps_after']}")
        report["repeats"] = {name: {"seconds": [r["seconds"] for r in rows],
                                    "median_s": statistics.median(r["seconds"] for r in rows),
                                    "median_over_floor": statistics.median(r["seconds"] for r in rows) / floor,
                                    "runs": rows} for name, rows in runs.items()}
        log("medians: " + ", ".join(f"{k} {v['median_s']:.2f} s = {v['median_over_floor']:.2f}x"
                                    for k, v in report["repeats"].items()))
    if args.peers and torch.cuda.is_available():
        report["peers"] = peers(args.dir)
    if args.cold:
        cold_floor = report["floors"]["cold_read_s"]
        for name in [None, *args.cold_schedules]:
            drop_page_cache()
            engine, run = timed_load(args.dir, args.device, False, schedule=name)
            engine.close()
            run["over_cold_floor"] = run["seconds"] / cold_floor
            report["load_cold" if name is None else f"load_cold_{name}"] = run
            log(f"Engine.load cold ({run['schedule']}) {run['seconds']:.2f} s {run['phases']} = "
                f"{run['over_cold_floor']:.2f}x the cold read ({cold_floor:.2f} s); reads ended "
                f"{run['timeline']['reads_end_s']}, registering ended {run['timeline']['registers_end_s']} s")
    harness.write(report, args)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
