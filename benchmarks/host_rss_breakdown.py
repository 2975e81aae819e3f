"""Where a `run`'s host memory goes: its RSS split by kind and by mapping, sampled through the run.

Issue 35 asks where the host memory above the checkpoint's size goes (a 34 GB Flux-size checkpoint
peaked at 45 GB RSS). This runs `omni-console run` as a child process and samples its
`/proc/PID/smaps_rollup` every `--interval` seconds (RSS split into anonymous, file-backed and shared
memory; locked bytes) and, at every new peak of at least 0.5 GB more, its `/proc/PID/smaps` (the
largest mappings by RSS, with their path or kind). It also timestamps `run`'s progress lines, so each
peak is placed in its phase (load, text encoding, denoise, decode).

    python -m benchmarks.host_rss_breakdown --model /tmp/flux-size --out rss.json -- --steps 2

Everything after `--` goes to `run` unchanged.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import harness

GB = 1e9
_ROLLUP_KEYS = ("Rss", "Pss_Anon", "Pss_File", "Pss_Shmem", "Anonymous", "AnonHugePages", "Locked", "Swap")


def rollup(pid: int) -> dict[str, int]:
    """`smaps_rollup`'s fields we report, in bytes."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in _ROLLUP_KEYS:
            fields[name] = int(rest.split()[0]) * 1024
    status = Path(f"/proc/{pid}/status").read_text()
    for key in ("RssAnon", "RssFile", "RssShmem", "VmLck", "VmPin"):
        match = re.search(rf"^{key}:\s+(\d+) kB", status, re.M)
        if match:
            fields[key] = int(match.group(1)) * 1024
    return fields


def largest_mappings(pid: int, top: int = 20) -> list[dict[str, Any]]:
    """The `top` mappings by RSS: path (or [anon]/[heap]), size, RSS, anonymous and locked bytes."""
    rows: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", head[0]):
            start, end = (int(x, 16) for x in head[0].split("-"))
            current = {"name": head[5] if len(head) > 5 else "[anon]", "size": end - start,
                       "rss": 0, "anon": 0, "locked": 0, "thp": 0}
            rows.append(current)
        elif current is not None and head:
            key = {"Rss:": "rss", "Anonymous:": "anon", "Locked:": "locked", "AnonHugePages:": "thp"}.get(head[0])
            if key:
                current[key] = int(head[1]) * 1024
    # group file mappings by path (a shared library has several), keep anonymous ones apart
    grouped: dict[str, dict[str, Any]] = {}
    for i, row in enumerate(rows):
        key = row["name"] if row["name"].startswith("/") else f"{row['name']}#{i}"
        slot = grouped.setdefault(key, {"name": row["name"], "size": 0, "rss": 0, "anon": 0, "locked": 0,
                                        "thp": 0, "mappings": 0})
        for field in ("size", "rss", "anon", "locked", "thp"):
            slot[field] += row[field]
        slot["mappings"] += 1
    by_rss = sorted(grouped.values(), key=lambda r: r["rss"], reverse=True)
    file_total = sum(r["rss"] for r in grouped.values() if r["name"].startswith("/"))
    return by_rss[:top] + [{"name": "(all file mappings)", "rss": file_total}]


def main() -> None:
    parser = harness.parser(__doc__, out="host_rss_breakdown.json")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("run_args", nargs="*", help="arguments for `run` (after --)")
    args = parser.parse_args()
    command = [sys.executable, "-c", "import sys; from omni_console.console.cli import main; sys.exit(main())",
               "run", "--model", str(args.model), "--output", "/tmp/host-rss-out.png", "--overwrite",
               *args.run_args]
    t0 = time.perf_counter()
    child = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []

    def read_progress() -> None:
        assert child.stderr is not None
        for line in child.stderr:
            lines.append((time.perf_counter() - t0, line.rstrip()))
            print(f"[{time.perf_counter() - t0:7.2f}] {line.rstrip()}", flush=True)

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    samples: list[dict[str, Any]] = []
    peaks: list[dict[str, Any]] = []
    best = 0
    while child.poll() is None:
        try:
            fields = rollup(child.pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            break
        now = time.perf_counter() - t0
        samples.append({"t": round(now, 3), **fields})
        if fields.get("Rss", 0) > best + 0.5 * GB:
            best = fields["Rss"]
            try:
                peaks.append({"t": round(now, 3), "rollup": fields, "phase": lines[-1][1] if lines else "",
                              "mappings": largest_mappings(child.pid)})
            except (FileNotFoundError, ProcessLookupError):
                break
        best = max(best, fields.get("Rss", 0))
        time.sleep(args.interval)
    child.wait()
    reader.join(timeout=5)
    peak = max(samples, key=lambda s: s.get("Rss", 0)) if samples else {}
    report = {"command": command[3:], "returncode": child.returncode, "peak": peak,
              "peak_snapshots": peaks[-3:], "progress": lines, "samples": samples[:: max(1, len(samples) // 400)]}
    harness.write(report, args)
    if peak:
        print("peak RSS {:.2f} GB at {:.1f} s: ".format(peak["Rss"] / GB, peak["t"])
              + ", ".join(f"{k} {peak[k] / GB:.2f}" for k in ("RssAnon", "RssFile", "RssShmem", "AnonHugePages",
                                                              "Locked") if k in peak))
    for snap in peaks[-1:]:
        print(f"largest mappings at {snap['t']} s ({snap['phase']}):")
        for row in snap["mappings"]:
            print("  {:>8.2f} GB rss  {:>8.2f} GB size  anon {:>6.2f}  locked {:>6.2f}  {}".format(
                row["rss"] / GB, row.get("size", 0) / GB, row.get("anon", 0) / GB, row.get("locked", 0) / GB,
                row["name"]))


if __name__ == "__main__":
    main()
