"""Issue 35 on a GPU machine: big models on small hosts, through the real CLI, in one call.

For each preset, in one process (which never starts CUDA itself):
  1. the checkpoint is written if missing (in a child: the writers use CUDA), and its files listed;
  2. the disk and the page cache are timed on those files: O_DIRECT reads (several in flight, 64 MiB
     aligned chunks), the same bytes through the engine's own disk-tier reader (benchmarks/tier_reader.py:
     offload/tier_files.py's O_DIRECT reads in the run's chunks, threads and bounce slots), then a buffered
     read after a drop (the disk through the page cache, readahead included) and the same read again (warm:
     the page cache's rate). The disk's sequential rate is the faster of the two cold harness reads. The
     files are dropped from the cache again afterwards;
  3. (wan32, after 4) one `run --mode resident` on the whole card and host: the step and output to compare
     with, holding every choice that changes the output equal to the tiered run's (its report's policy: VAE
     tiling and slicing, feed-forward chunking, fp8 storage, compile, step cache: `reference_flags`);
  4. under a card of C GB (benchmarks/ballast.py) and a host of N GB (benchmarks/host_limit.py: a child
     page-locks all but N GB of MemAvailable; refused when the machine cannot), the checkpoint is dropped
     from the page cache (posix_fadvise DONTNEED, checked by mincore), then `plan --json`, a cold
     `run --json` and `plan --json` again (what the profile learned) run with `--ram-budget auto
     --vram-budget auto`. The run's peak RSS is its VmHWM (polled), its own rusage and the polled
     anonymous+shared peak; NVML's per-process device peak is sampled beside it;
  5. ratios (`host_tiers_figures.ratios`): step / forecast floor, peak RSS / host, peak RSS / host forecast
     (before and after the first request), the engine's disk-tier reader's rate / the disk's sequential rate
     (and the rate the plan's probe cached in the children's cache dir / the same), step / resident, output
     identical to resident (and the largest pixel difference of the decoded frames); `nowaste`: peak RSS /
     (the plan's pinned and staged bytes + the process's own base RSS the plan names + 1.5 GB), and without
     the base term (the issue's words taken literally); `a14b`: the expert switch's step (found from the
     run's progress lines) / the median of the other steps but the first, and / the new expert's later steps.

Each preset keeps back the time the presets after it need (`Preset.need_s`) from the `--deadline-s` box.

`--ram-budget` is used only where `run --help` lists it (an older CLI runs without it, as today's
baseline). Every key the figures are read from is recorded beside the figure (`--key` overrides one).

Presets (device time on an H100, checkpoint writes included; the GPU machine's 64 GB disk holds one
of the checkpoints, so run the Flux-size presets, wan32 and a14b in separate calls, see gpu_run.sh):
  flux16   Flux-dev-size (34 GB), 16 GB host, 12 GB card, 1024², 4 steps       ~3-4 min (+1 min write)
  nowaste  the same checkpoint, whole host, 12 GB card, no --ram-budget, 2 steps  ~1 min (no second plan)
  wan32    Wan2.1-14B-size + UMT5-XXL (24 layers, 256k vocab), 81x480x832, guidance 5, 3 steps, 32 GB
           host, 12 GB card, with a resident reference run                   ~5-6 min (+1.5 min write)
  a14b     Wan 2.2 A14B-size, both experts stored in fp8 (benchmarks/wan22_checkpoint.py, 40.9 GB), 81x480x832,
           guidance 4, 9 steps (the switch at step 7), 32 GB host, 16 GB card: the switch step against the others
                                                                             ~4.5 min (+1.5 min write)
  tiny     the embedded demo model on the CPU (`--cpu`): every step of the harness in seconds
  tiny-ref the same at 128² with `--vae-tiling on` and a resident reference (which must be given it to match)
  tiny-a14b  a14b's writer with 3-block experts, on the CPU: the switch step found and timed

    python3 -m benchmarks.host_tiers --presets flux16 nowaste --out host_tiers.json
    python3 -m benchmarks.host_tiers --presets wan32 --dir /tmp/wan-size --out host_tiers_wan.json
    python3 -m benchmarks.host_tiers --presets a14b --dir /tmp/a14b-fp8 --out host_tiers_a14b.json
    python3 -m benchmarks.host_tiers --presets flux16 --dry-run     # the commands, nothing run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import harness
from .child_watch import run_watched
from .file_cache import CHUNK, DEPTH, cache_state, checkpoint_files, drop, read_rate
from .host_limit import GB, HostLimitError, available, host_limit
from .host_tiers_figures import output_diff, ratios, steady_step, table
from .tier_reader import BLOCK, engine_reader_rate


@dataclass(frozen=True, slots=True)
class Preset:
    """One measurement: the model, the host and card it runs on, the budgets it asks for."""

    kind: str  # flux | wan | demo
    host_gb: float | None  # None: the whole host
    card_gb: float | None  # None: the whole card (or the CPU)
    ram_budget: str | None
    vram_budget: str | None
    steps: int
    resident_reference: bool = False
    reference_s: float = 0.0  # what the resident reference took (kept back from the tiered children's box)
    no_waste: bool = False
    plan_after: bool = True  # a second `plan` after the run: what the profile learned (the forecast after one)
    need_s: float = 60.0  # what its children took on an H100 (checkpoint written): later presets keep this back
    size: str = ""  # a request size of SIZES other than its kind's
    expert_switch: bool = False  # two experts (Wan 2.2 A14B): the boundary step's time against the other steps
    extra: tuple[str, ...] = ()  # more flags for the tiered plan and run (not the reference: it gets what they chose)


PRESETS = {
    # plan 16 s + run 68 s + plan 15 s on the H100 (2026-12-06)
    "flux16": Preset("flux", 16, 12, "auto", "auto", 4, need_s=110),
    # plan 11-16 s + run 30 s (cold, 2 steps at 1024²; the run's peak RSS is its load and its first request's
    # libraries, neither of which more steps change); no second plan: its forecast-after is flux16's figure
    "nowaste": Preset("flux", None, 12, None, "auto", 2, no_waste=True, plan_after=False, need_s=75),
    "wan32": Preset("wan", 32, 12, "auto", "auto", 3, resident_reference=True, reference_s=100, need_s=300),
    "tiny": Preset("demo", None, None, "auto", None, 2, need_s=30),
    # the resident reference on the CPU: VAE tiling on at 128² (the demo VAE tiles 64² pieces: pixels differ
    # from an untiled decode), so the reference must be given it too to match
    # Wan 2.2 A14B-size, both experts stored in fp8 (40.9 GB), 32 GB host, 16 GB card: it runs; the expert switch
    # adds <= 5 % to its step. 9 steps: UniPC with flow shift 12 switches at step 7 (timestep 857), so the low-noise
    # expert has a step after the switch's to compare with. Not measured yet: plan ~25 s, run ~150 s, plan ~25 s
    "a14b": Preset("a14b", 32, 16, "auto", "auto", 9, expert_switch=True, need_s=300),
    "tiny-a14b": Preset("a14b-tiny", None, None, "auto", None, 9, expert_switch=True, plan_after=False, need_s=40),
    "tiny-ref": Preset("demo", None, None, "auto", None, 2, resident_reference=True, reference_s=20, plan_after=False,
                       need_s=40, size="demo128", extra=("--vae-tiling", "on")),
}
SIZES: dict[str, dict[str, Any]] = {
    "flux": {"height": 1024, "width": 1024, "guidance": 3.5, "output": "out.png"},
    "wan": {"height": 480, "width": 832, "frames": 81, "guidance": 5.0, "output": "out.mp4"},
    "demo": {"height": 64, "width": 64, "guidance": 3.5, "output": "out.png"},
    "demo128": {"height": 128, "width": 128, "guidance": 3.5, "output": "out.png"},
    # guidance 4.0: Wan2.2 t2v_A14B's high-noise scale (diffusers gives the low-noise expert the same without
    # guidance_scale_2; the original's 3.0 changes no cost: both run two forwards a step)
    "a14b": {"height": 480, "width": 832, "frames": 81, "guidance": 4.0, "output": "out.mp4"},
    "a14b-tiny": {"height": 32, "width": 32, "frames": 5, "guidance": 4.0, "output": "out.mp4"},
}
DEFAULT_DIRS = {"flux": "/tmp/flux-size", "wan": "/tmp/wan-size", "demo": "/tmp/host-tiers-demo",
                "a14b": "/tmp/a14b-fp8", "a14b-tiny": "/tmp/host-tiers-a14b-tiny"}
CLI = ["-m", "omni_console.console.cli"]
_RATES: dict[str, dict[str, Any]] = {}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Deadline:
    """The harness's whole time box: each child gets what is left (less a margin and what the presets after it
    need: `reserve`), and none under 20 s. The no-waste run was once killed by the box after flux16 took it all."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.reserve = 0.0

    def left(self, cap: float) -> float | None:
        rest = self.end - time.monotonic() - 10 - self.reserve
        return min(cap, rest) if rest >= 20 else None


def cli_supports(flag: str, command: str = "run") -> bool:
    """Whether this build's `COMMAND --help` lists `flag` (wt-rambudget adds --ram-budget)."""
    done = subprocess.run([sys.executable, *CLI, command, "--help"], capture_output=True, text=True, timeout=120)
    return flag in done.stdout


def write_model(kind: str, root: Path) -> float | None:
    """Write the checkpoint in a child if `root` has none; the seconds it took (None: it was there)."""
    if (root / "model_index.json").exists():
        return None
    code = {"flux": "from benchmarks.engine_e2e import write_checkpoint as w",
            "wan": "from benchmarks.video_e2e import write_checkpoint as w",
            "demo": "from omni_console.engine.demo.demo_model import build_demo_model as w",
            "a14b": "from benchmarks.wan22_checkpoint import write_a14b_checkpoint as w",
            "a14b-tiny": "import functools; from benchmarks.wan22_checkpoint import write_a14b_checkpoint; "
                         "w = functools.partial(write_a14b_checkpoint, device='cpu', tiny=True)"}[kind]
    log(f"writing the {kind}-size checkpoint to {root}")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"{code}; from pathlib import Path; w(Path({str(root)!r}))"], check=True)
    return time.perf_counter() - t0


def measure_rates(files: list[Path], args: argparse.Namespace) -> dict[str, Any]:
    """O_DIRECT, cold buffered and warm buffered read rates of (the first `--rate-gb` of) the files."""
    limit, chunk = int(args.rate_gb * GB), args.chunk_mb * 2**20
    out: dict[str, Any] = {"limit_bytes": limit, "depth": args.depth, "chunk_bytes": chunk}
    try:
        direct = read_rate(files, direct=True, limit=limit, depth=args.depth, chunk=chunk)
        out["direct_bytes_per_s"], out["direct_bytes"] = direct.bytes_per_s, direct.nbytes
    except OSError as exc:  # tmpfs and some overlays refuse O_DIRECT
        out["direct_error"] = str(exc)
    # the same bytes through the engine's own disk-tier reader (offload/tier_files.py, as a run's disk tier reads)
    try:
        engine = engine_reader_rate(files, limit=limit, block=args.reader_block_mb * 2**20)
        out["engine_reader"] = {**asdict(engine), "bytes_per_s": engine.bytes_per_s}
    except OSError as exc:
        out["engine_reader"] = {"error": str(exc)}
    drop(files)
    out["cached_fraction_after_drop"] = round(cache_state(files).fraction, 4)
    cold = read_rate(files, direct=False, limit=limit, depth=args.depth, chunk=chunk)
    warm = read_rate(files, direct=False, limit=limit, depth=args.depth, chunk=chunk)
    drop(files)
    out.update({"cold_buffered_bytes_per_s": cold.bytes_per_s, "warm_buffered_bytes_per_s": warm.bytes_per_s,
                "buffered_bytes": cold.nbytes,
                "disk_seq_bytes_per_s": max(cold.bytes_per_s, out.get("direct_bytes_per_s", 0.0))})
    out["page_cache_bytes_per_s"] = out["warm_buffered_bytes_per_s"]
    reader = out["engine_reader"]
    log("rates: O_DIRECT {}, the engine's reader {}, cold buffered {:.2f} GB/s, warm (page cache) {:.2f} GB/s".format(
        f"{out['direct_bytes_per_s'] / GB:.2f} GB/s" if "direct_bytes_per_s" in out else out.get("direct_error"),
        f"{reader['bytes_per_s'] / GB:.2f} GB/s{'' if reader['o_direct'] else ' (buffered: no O_DIRECT)'}"
        if "bytes_per_s" in reader else reader.get("error"), cold.bytes_per_s / GB, warm.bytes_per_s / GB))
    return out


def filesystem_key(path: Path) -> str:
    """engine/planning/tier_rates.py's key of a checkpoint's file system (its device number)."""
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def engine_tier_rates(cache: Path, root: Path) -> dict[str, Any] | None:
    """The tier rates the engine's probe measured and cached for `root`'s file system during the children's
    plan/run (`<cache>/tier_rates/<hash>.json`, engine/planning/tier_rates.py's `CachedRates`), with its path."""
    want = filesystem_key(root)
    for path in sorted((cache / "tier_rates").glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("filesystem") == want:
            return {**doc, "path": str(path)}
    return None


REFERENCE_FLAG_FORMS = ("--vae-tiling on|off", "--vae-slicing on|off", "--ff-chunking on|off", "[--stream-dtype D]",
                        "[--fp8-modulation]", "[--compile regional]", "[--cache SPEC]")
LEAN_NOT_EXACT = ("vae_tiling", "vae_slicing", "ff_chunking")  # engine/planning/lean.py: EXACTNESS (stream_encoders
# is exact, bit-identical; slicing differs from a batched decode in the last bits; ff chunking is unverified on a GPU)


def reference_flags(doc: dict[str, Any] | None) -> list[str]:
    """The flags that give the resident reference every output-changing choice the tiered run made (from its
    `run --json`, else its `plan --json`): the lean phases that are not exact, on or off as the run had them
    (`--vram-budget auto` turns VAE tiling on for a small card), fp8 storage, compile and the step cache."""
    doc = doc or {}
    policy = doc.get("policy") or {}
    argv: list[str] = []
    for name in LEAN_NOT_EXACT:
        argv += ["--" + name.replace("_", "-"), "on" if policy.get(name) == "on" else "off"]
    if policy.get("stream_dtype"):
        argv += ["--stream-dtype", str(policy["stream_dtype"])]
    if policy.get("fp8_modulation"):
        argv += ["--fp8-modulation"]
    if (doc.get("compile") or {}).get("on"):
        argv += ["--compile", "regional"]
    if (doc.get("cache") or {}).get("cache"):
        argv += ["--cache", str(doc["cache"]["cache"])]
    return argv


def flags(command: str, preset: Preset, args: argparse.Namespace, root: Path, out_dir: Path,
          ram_flag: bool, *, resident: bool = False, matched: list[str] | None = None) -> list[str]:
    """The CLI's arguments for `plan` or `run` under this preset (`resident`: the reference run, with `matched`:
    the tiered run's output-changing choices, `reference_flags`)."""
    size = SIZES[preset.size or preset.kind]
    argv = [command, "--model", str(root), "--device", args.device, "--json", "--height", str(size["height"]),
            "--width", str(size["width"]), "--guidance", str(size["guidance"])]
    if "frames" in size:
        argv += ["--frames", str(size["frames"])]
    if resident:
        argv += ["--mode", "resident", *(matched or [])]
    else:
        vram = args.vram_budget or preset.vram_budget
        if vram and not args.cpu:
            argv += ["--vram-budget", vram]
        ram = args.ram_budget or preset.ram_budget
        if ram and ram_flag:
            argv += [args.ram_flag, ram]
        argv += [*preset.extra, *shlex.split(args.extra)]
    if command == "run":
        name = ("resident-" if resident else "") + size["output"]
        argv += ["--steps", str(args.steps or preset.steps), "--prompt", "a red fox in the snow", "--seed", "3",
                 "--output", str(out_dir / name), "--overwrite"]
    return argv


def call(argv: list[str], cache: Path, args: argparse.Namespace, deadline: Deadline) -> dict[str, Any]:
    """One CLI child, watched; its JSON document (or its one error line) and its memory peaks."""
    timeout = deadline.left(args.run_timeout)
    if timeout is None:
        return {"skipped": "the harness's --deadline-s ran out"}
    log("omni-console " + " ".join(argv))
    env = {**os.environ, "OMNI_CONSOLE_CACHE_DIR": str(cache)}
    watched = run_watched([sys.executable, *CLI, *argv], env=env, timeout=timeout, oom_score_adj=1000,
                          nvml_index=None if args.cpu or argv[0] != "run" else args.gpu)
    result: dict[str, Any] = {"argv": argv, **watched.summary()}
    if argv[0] == "run":  # its progress lines: each step and each expert switch, in order (the switch's step)
        result["progress"] = [ln for ln in watched.stderr.splitlines() if ln.startswith(("step ", "expert "))][:400]
    if watched.returncode == 0:
        try:
            result["doc"] = json.loads(watched.stdout)
        except json.JSONDecodeError:
            result["error"] = "stdout was not JSON"
    else:
        lines = [ln for ln in watched.stderr.strip().splitlines() if "kept in float32" not in ln]
        errors = [ln for ln in lines if ln.startswith("omni-console:")]
        result["error"] = (errors or lines or [f"exit {watched.returncode}"])[-1]
        if watched.returncode == -9 and not watched.timed_out:
            result["error"] += " (SIGKILL: the kernel's OOM killer?)"
        result["stderr_tail"] = lines[-20:]
    log(f"  exit {watched.returncode}, {watched.wall_s:.1f} s, peak RSS "
        f"{(watched.peak_rss or 0) / GB:.2f} GB" + (f": {result['error']}" if "error" in result else ""))
    return result


@contextlib.contextmanager
def card_and_host(preset: Preset, args: argparse.Namespace, entry: dict[str, Any]) -> Iterator[None]:
    """The card's ballast (first: its own host memory is then outside the host), then the host limiter."""
    with contextlib.ExitStack() as stack:
        card = args.card_gb if args.card_gb is not None else preset.card_gb
        if card is not None and not args.cpu:
            from .ballast import ballast

            held = stack.enter_context(ballast(card, args.gpu))
            entry["card"] = {"card_gb": card, "free_cuda": held.free_cuda, "free_nvml": held.free_nvml}
        host = host_bytes(preset, args)
        if host is not None:
            limit = stack.enter_context(host_limit(host, max_hold=args.max_hold))
            entry["host_limit"] = asdict(limit)
            log(f"host of {host / GB:.2f} GB: MemAvailable {limit.available_before / GB:.2f} -> "
                f"{limit.available_after / GB:.2f} GB, {limit.held / GB:.2f} GB locked (OOM {limit.oom})")
        yield


def host_bytes(preset: Preset, args: argparse.Namespace) -> int | None:
    """The simulated host's bytes: --host-margin-mb (the available memory less that), --host-gb, else the preset's."""
    if args.host_margin_mb is not None:
        return available() - args.host_margin_mb * 2**20
    gb = args.host_gb if args.host_gb is not None else preset.host_gb
    return None if gb is None else int(gb * GB)


def run_preset(name: str, args: argparse.Namespace, deadline: Deadline, ram_flag: bool) -> dict[str, Any]:
    preset = PRESETS[name]
    root = Path(args.dir or DEFAULT_DIRS[preset.kind])
    entry: dict[str, Any] = {"preset": name, "settings": asdict(preset), "model": str(root),
                             "ram_flag_supported": ram_flag, "no_waste": preset.no_waste,
                             "expert_switch": preset.expert_switch}
    entry["write_s"] = write_model(preset.kind, root)
    files = checkpoint_files(root)
    entry["checkpoint_bytes"] = sum(p.stat().st_size for p in files)
    if str(root) not in _RATES:  # once per checkpoint and harness run
        _RATES[str(root)] = measure_rates(files, args)
    entry["rates"] = _RATES[str(root)]
    work = Path(tempfile.mkdtemp(prefix=f"host-tiers-{name}-"))
    cache = work / "cache"
    cache.mkdir()
    entry["available_before"] = available()
    kept_back = deadline.reserve
    deadline.reserve += preset.reference_s  # the resident reference runs after the tiered children
    with card_and_host(preset, args, entry):
        entry["host_bytes"] = entry.get("host_limit", {}).get("host_bytes")
        for step in ("plan", "run", "plan_after") if preset.plan_after else ("plan", "run"):
            drop(files)
            entry[f"cache_before_{step}"] = asdict(cache_state(files))
            result = call(flags("run" if step == "run" else "plan", preset, args, root, work, ram_flag), cache,
                          args, deadline)
            if "doc" in result:
                entry[f"{step}_doc"] = result.pop("doc")
            entry[step] = result
            if "host_limit" in entry and not _alive(entry["host_limit"]["pid"]):
                # the OOM killer took the limiter: from here on the host was not N GB
                entry["host_void"] = f"the host limiter died during {step}"
                log(f"  VOID: {entry['host_void']}")
                break
        if "host_limit" in entry:
            entry["host_limit"]["alive_after"] = _alive(entry["host_limit"]["pid"])
    entry["available_after_release"] = available()
    deadline.reserve = kept_back
    entry["engine_tier_rates"] = engine_tier_rates(cache, root)
    if preset.resident_reference:
        resident_reference(preset, args, root, work, ram_flag, deadline, entry)
    entry["ratios"] = ratios(entry, dict(k.split("=", 1) for k in args.key))
    return entry


def resident_reference(preset: Preset, args: argparse.Namespace, root: Path, work: Path, ram_flag: bool,
                       deadline: Deadline, entry: dict[str, Any]) -> None:
    """`run --mode resident` on the whole card and host, after the tiered run, with its output-changing choices
    (`reference_flags` of its report, else of its plan); its step and output beside the tiered run's."""
    source = "run_doc" if "run_doc" in entry else "plan_doc" if "plan_doc" in entry else None
    matched = reference_flags(entry.get(source) if source else None)
    (work / "resident").mkdir()
    ref = call(flags("run", preset, args, root, work, ram_flag, resident=True, matched=matched), work / "resident",
               args, deadline)
    entry["resident"] = {k: v for k, v in ref.items() if k != "doc"}
    entry["resident"].update({"matched_flags": matched, "matched_from": f"{source}.policy" if source else None})
    if "doc" in ref:
        entry["resident"].update({"steady_step_s": steady_step(ref["doc"]), "policy": ref["doc"].get("policy"),
                                  "steps_s": [s["wall_s"] for s in ref["doc"].get("steps", [])],
                                  "phases": ref["doc"].get("phases")})
    out = SIZES[preset.size or preset.kind]["output"]
    entry["resident_diff"] = output_diff(work / out, work / f"resident-{out}")
    entry["identical_to_resident"] = (entry["resident_diff"] or {}).get("identical")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = harness.parser(__doc__, out="host_tiers.json")
    p.add_argument("--presets", nargs="+", choices=sorted(PRESETS), default=["flux16"])
    p.add_argument("--dir", type=Path, default=None, help="model directory (default per kind; written if missing)")
    p.add_argument("--cpu", action="store_true", help="run the CLI on the CPU: no card, no NVML (CI, the tiny preset)")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--host-gb", type=float, default=None, help="the simulated host (default: the preset's)")
    p.add_argument("--host-margin-mb", type=int, default=None,
                   help="simulate a host of the available memory less this (a tiny limit: the CPU test)")
    p.add_argument("--max-hold", type=int, default=None, help="lock at most this many bytes (tests)")
    p.add_argument("--card-gb", type=float, default=None, help="the simulated card (default: the preset's)")
    p.add_argument("--ram-budget", default=None, help="override the preset's --ram-budget value")
    p.add_argument("--vram-budget", default=None, help="override the preset's --vram-budget value")
    p.add_argument("--ram-flag", default="--ram-budget", help="the CLI's host-budget flag (used if run lists it)")
    p.add_argument("--extra", default="", help="more flags for plan and run, e.g. '--stream-dtype float8_e4m3fn'")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--rate-gb", type=float, default=8.0, help="bytes read to time each tier (default 8 GB)")
    p.add_argument("--depth", type=int, default=DEPTH, help="reads in flight")
    p.add_argument("--chunk-mb", type=int, default=CHUNK // 2**20)
    p.add_argument("--reader-block-mb", type=int, default=BLOCK // 2**20,
                   help="block size for timing the engine's disk-tier reader (its chunks and threads are the engine's)")
    p.add_argument("--run-timeout", type=float, default=420.0, help="seconds for one CLI child")
    p.add_argument("--deadline-s", type=float, default=540.0, help="the whole harness's time box")
    p.add_argument("--key", action="append", default=[], metavar="FIGURE=a.b.c",
                   help="read a figure from this key first (names in host_tiers_figures.KEYS)")
    p.add_argument("--dry-run", action="store_true", help="print each preset's commands; run nothing")
    args = p.parse_args(argv)
    args.device = "cpu" if args.cpu else f"cuda:{args.gpu}"
    return args


def dry_run(args: argparse.Namespace, ram_flag: bool) -> None:
    work = Path("/tmp/host-tiers-dry")
    for name in args.presets:
        preset, root = PRESETS[name], Path(args.dir or DEFAULT_DIRS[PRESETS[name].kind])
        host = host_bytes(preset, args)
        print(f"{name}: {preset.kind} at {root}; host {'whole' if host is None else f'{host / GB:.2f} GB'}, "
              f"card {preset.card_gb or 'whole'} GB; --ram-budget {'used' if ram_flag else 'not in this CLI'}")
        for command in ("plan", "run", "plan")[: 3 if preset.plan_after else 2]:
            print("  omni-console " + " ".join(flags(command, preset, args, root, work, ram_flag)))
        if preset.resident_reference:  # after the tiered run, with its report's output-changing choices
            shown = ["[the run report's: " + " ".join(REFERENCE_FLAG_FORMS) + "]"]
            print("  omni-console " + " ".join(flags("run", preset, args, root, work, ram_flag, resident=True,
                                                      matched=shown)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for name in args.presets:  # a host this machine cannot simulate is refused before anything runs
        host = host_bytes(PRESETS[name], args)
        if host is not None and not args.dry_run and available() <= host:
            print(f"host_tiers: cannot simulate a {host / GB:.2f} GB host ({name}): only "
                  f"{available() / GB:.2f} GB available", file=sys.stderr)
            return 2
    ram_flag = cli_supports(args.ram_flag)
    if args.dry_run:
        dry_run(args, ram_flag)
        return 0
    deadline = Deadline(args.deadline_s)
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "command": [sys.executable, "-m",
                              "benchmarks.host_tiers", *(argv if argv is not None else sys.argv[1:])],
                              "ram_flag_supported": ram_flag, "mem_total_and_available": _meminfo(),
                              "presets": []}
    for i, name in enumerate(args.presets):
        deadline.reserve = sum(PRESETS[later].need_s for later in args.presets[i + 1 :])
        try:
            report["presets"].append(run_preset(name, args, deadline, ram_flag))
        except HostLimitError as exc:
            print(f"host_tiers: {exc}", file=sys.stderr)
            return 2
        report["table"] = table(report["presets"])
        harness.write(report, args, device=args.device)  # partial results survive a later failure
    print(report["table"], flush=True)
    log(f"wrote {args.out}")
    return 0


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _meminfo() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable", "Cached", "SwapTotal"):
            fields[key] = int(rest.split()[0]) * 1024
    return fields


if __name__ == "__main__":
    sys.exit(main())
