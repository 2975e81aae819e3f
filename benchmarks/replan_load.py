"""Time to ready against its floors, and live re-plan against moved bytes / bandwidth (issue: ready at
the storage limit).

1. Floors on a checkpoint directory's safetensors files (page cache warm unless --cold):
   - read into fresh host memory with 1 thread and with N threads (os.preadv into one buffer);
   - cudaHostRegister of the filled buffer, alone;
   - register first, then read into the registered buffer (N threads);
   - --cold: the same N-thread read after `sync; echo 3 > /proc/sys/vm/drop_caches` (root only).
2. Engine.load of the checkpoint (every block streamed, everything staged) with its phase split
   (read / arrange / register), against the N-thread read + register floor.
3. Live re-plan on the loaded model (--replan): resident layers 0 -> N -> 0, each against
   moved bytes / the streamer's measured copy rate + 0.1 s.

Usage: python benchmarks/replan_load.py --dir /tmp/flux-size --threads 16 --replan 28 --out replan_load.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omni_console.engine.engine import Engine
from omni_console.offload.pinned import HostArena
from omni_console.offload.policy import build_policy

CHUNK = 64 << 20


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def files_of(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.safetensors") if p.is_file())


def read_into(files: list[Path], buffer: np.ndarray, threads: int) -> float:
    """Read every file back to back into `buffer` in CHUNK pieces on `threads` threads; seconds."""
    jobs, offset = [], 0
    for path in files:
        size = path.stat().st_size
        for start in range(0, size, CHUNK):
            jobs.append((path, start, min(CHUNK, size - start), offset + start))
        offset += size
    view = memoryview(buffer)

    def run(job: tuple[Path, int, int, int]) -> None:
        path, start, length, dest = job
        fd = os.open(path, os.O_RDONLY)
        try:
            os.preadv(fd, [view[dest:dest + length]], start)
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, jobs))
    return time.perf_counter() - t0


def floors(files: list[Path], threads: int, cold: bool) -> dict[str, Any]:
    total = sum(p.stat().st_size for p in files)
    out: dict[str, Any] = {"bytes": total, "threads": threads}
    for n in (1, threads):
        buf = np.empty(total, dtype=np.uint8)
        out[f"read_{n}_threads_s"] = read_into(files, buf, n)
        log(f"read {total / 1e9:.1f} GB with {n} thread(s): {out[f'read_{n}_threads_s']:.2f} s")
        del buf
    if torch.cuda.is_available():
        arena = HostArena(total, pin=False)
        read_into(files, arena.tensor.numpy(), threads)
        t0 = time.perf_counter()
        arena.pin()
        out["register_s"] = time.perf_counter() - t0
        arena.close()
        arena = HostArena(total, pin=True)
        out["register_then_read_s"] = read_into(files, arena.tensor.numpy(), threads)
        arena.close()
        log(f"register alone {out['register_s']:.2f} s; register then read {out['register_then_read_s']:.2f} s")
    if cold:
        subprocess.run(["sync"], check=False)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        buf = np.empty(total, dtype=np.uint8)
        out["cold_read_s"] = read_into(files, buf, threads)
        log(f"cold read: {out['cold_read_s']:.2f} s")
    out["floor_s"] = min(out[f"read_{threads}_threads_s"] + out.get("register_s", 0.0),
                         out.get("register_then_read_s", float("inf")))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 4)
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--replan", type=int, default=None, metavar="N", help="re-plan 0 -> N -> 0 resident layers")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="replan_load.json")
    args = parser.parse_args()
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "dir": str(args.dir)}
    report["floors"] = floors(files_of(args.dir), args.threads, args.cold)
    engine = Engine(args.dir, device=args.device, live_replan=args.replan is not None)
    try:
        load = engine.load(build_policy({}, 0))
        report["load"] = {"seconds": load.seconds, "phases": load.phases, "pinned_bytes": load.pinned_bytes,
                          "over_floor": load.seconds / report["floors"]["floor_s"]}
        log(f"Engine.load {load.seconds:.2f} s {load.phases} = {report['load']['over_floor']:.2f}x the floor")
        if args.replan is not None:
            streamer = engine.placement.streamer
            rate = streamer.observed_bandwidth or 1e10
            rows = []
            for layers in (args.replan, 0):
                event = engine.replan(build_policy({}, layers))
                moved = event.copied_bytes + event.ring_bytes
                target = 1.2 * moved / rate + 0.1
                rows.append({"to": layers, "seconds": event.seconds, "copied": event.copied_bytes,
                             "freed": event.freed_bytes, "ring": event.ring_bytes, "target_s": target})
                log(f"re-plan to {layers}: {event.seconds:.3f} s (target {target:.3f} s) {event.summary}")
            report["replan"] = rows
    finally:
        engine.close()
    Path(args.out).write_text(json.dumps(report, indent=2))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
