"""Real cards on one large GPU: plan, then one request, on 8/12/16/24 GB cards made by a ballast.

For a model directory (written once by the Flux-size writer of engine_e2e.py or the Wan2.1-14B-size
writer of video_e2e.py, in a subprocess so this process never holds a CUDA context of its own) and
a list of cards: for each card, with a fresh cache directory (no profile, no measured footprint),
under a ballast (`ballast.py`) that leaves exactly that much of the GPU free:
  1. `omni-console plan --json --vram-budget CARD` (or `auto`): the policy chosen, the predicted
     device memory of the process (and torch's allocated peak) and step; "nothing fits" is recorded
     with its one line (the smallest possible peak);
  2. `omni-console run --json` with the same flags: NVML's per-process peak, sampled here in a
     thread through nvidia-ml-py (by PID; where a PID namespace hides it, the device's used bytes
     above what they were before the run), the run's own NVML and torch peaks, step times, OOM
     step-downs;
  3. with `--repeat`, plan and run again in the same cache (after one request of this size).
Prints the table (card, policy, lean phases, predicted vs measured peak and step, ratios) and
writes JSON. `--alternatives 4 8` also runs the planner's policy with 4 and 8 more resident blocks under
the same card (no budget) for the best measured configuration that fits. `--resident-reference` runs
`--mode resident` once without a ballast for the resident
step time the targets compare with.

    python3 -m benchmarks.real_cards --kind wan --dir /tmp/wan-size --cards 8 12 16 24 --guidance 5 \\
        --steps 3 --out real_cards_wan.json
    python3 -m benchmarks.real_cards --kind flux --dir /tmp/flux-size --cards 8 12 16 24 --out real_cards_flux.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .ballast import GB, ballast

SIZES = {"flux": {"height": 1024, "width": 1024, "frames": None, "guidance": 3.5, "steps": 4},
         "wan": {"height": 480, "width": 832, "frames": 81, "guidance": 5.0, "steps": 3}}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_model(kind: str, root: Path) -> None:
    """Write the checkpoint in a child process (the writers use CUDA; this process must not)."""
    if (root / "model_index.json").exists():
        return
    module = "engine_e2e" if kind == "flux" else "video_e2e"
    code = (f"from pathlib import Path; from benchmarks.{module} import write_checkpoint; "
            f"write_checkpoint(Path({str(root)!r}))")
    log(f"writing the {kind}-size checkpoint to {root}")
    subprocess.run([sys.executable, "-c", code], check=True)


class NvmlSampler(threading.Thread):
    """Samples, every 50 ms, the per-process NVML figure of `pid` and the device's used bytes."""

    def __init__(self, index: int) -> None:
        super().__init__(daemon=True)
        import pynvml

        self.nv, self.pid = pynvml, -1  # set once the process under test has started
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.baseline = int(pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        self.process_peak: int | None = None
        self.used_peak = self.baseline
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            self.sample()

    def sample(self) -> None:
        nv = self.nv
        try:
            self.used_peak = max(self.used_peak, int(nv.nvmlDeviceGetMemoryInfo(self.handle).used))
            for p in nv.nvmlDeviceGetComputeRunningProcesses(self.handle):
                if int(p.pid) == self.pid and p.usedGpuMemory is not None:
                    self.process_peak = max(self.process_peak or 0, int(p.usedGpuMemory))
        except nv.NVMLError:
            pass

    def stop(self) -> dict[str, int | None]:
        self.done.set()
        self.join(timeout=5)
        self.sample()
        self.nv.nvmlShutdown()
        return {"nvml_process_peak": self.process_peak, "nvml_device_delta_peak": self.used_peak - self.baseline}


def cli(args: argparse.Namespace, command: str, budget: str | None, cache: Path, extra: list[str],
        index: int) -> dict[str, Any]:
    size = SIZES[args.kind]
    flags = ["--model", str(args.dir), "--device", f"cuda:{index}", "--height", str(size["height"]),
             "--width", str(size["width"]), "--guidance", str(args.guidance or size["guidance"]), "--json"]
    if size["frames"]:
        flags += ["--frames", str(size["frames"])]
    if budget is not None:
        flags += ["--vram-budget", budget]
    if command == "run":
        out = cache / ("out.mp4" if size["frames"] else "out.png")
        flags += ["--steps", str(args.steps or size["steps"]), "--prompt", "a red fox in the snow", "--seed", "3",
                  "--output", str(out), "--overwrite"]
    cmd = [sys.executable, "-m", "omni_console.console.cli", command, *flags, *extra]
    env = {**os.environ, "OMNI_CONSOLE_CACHE_DIR": str(cache)}
    sampler = NvmlSampler(index) if command == "run" else None  # its baseline: before the process starts
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if sampler is not None:
        sampler.pid = proc.pid
        sampler.start()
    stdout, stderr = proc.communicate()
    result: dict[str, Any] = {"returncode": proc.returncode, "wall_s": time.perf_counter() - t0}
    if sampler is not None:
        result.update(sampler.stop())
    if proc.returncode != 0:
        lines = [line for line in stderr.strip().splitlines() if "kept in float32" not in line]
        errors = [line for line in lines if line.startswith("omni-console:")]  # the one failure line
        result["error"] = (errors or lines or [""])[-1]
        result["stderr_tail"] = lines[-25:]
        return result
    result["doc"] = json.loads(stdout)
    return result


def recorded_profiles(cache: Path) -> list[dict[str, Any]]:
    """Each phase's measured bytes above the weights, as the run's profile recorded them (none after a step-down)."""
    keys = ("size", "text_extra_bytes", "denoise_extra_bytes", "decode_extra_bytes", "forwards_per_step")
    return [{k: doc.get(k) for k in keys} for doc in
            (json.loads(p.read_text()) for p in sorted((cache / "profiles").glob("*.json")))]


def summarize_plan(doc: dict[str, Any]) -> dict[str, Any]:
    rf, f = doc["request_forecast"], doc["forecast"]
    staged = sorted(c["name"] for c in doc["components"] if c["residency"] == "staged")
    reasons = (doc.get("auto_plan") or {}).get("reasons", [])
    return {"policy": f"{f['num_resident_blocks']} resident ({f['placement']}), k={f['streaming_slots']}, "
                      f"staged: {','.join(staged) or '-'}",
            "lean": [r for r in reasons if any(w in r.lower() for w in ("tiling", "tiled", "slicing", "chunk",
                                                                          "encoder streamed"))],
            "predicted_process_peak": rf.get("process_peak_bytes"), "predicted_allocated_peak": rf["peak_bytes"],
            "peak_source": rf["peak_source"], "predicted_step_s": rf["step_seconds"], "reasons": reasons}


def summarize_run(result: dict[str, Any]) -> dict[str, Any]:
    doc = result["doc"]
    steps = [s["wall_s"] for s in doc["steps"]]
    # the run's own figure is at least the context + its reserved peak (samples can miss a short peak)
    seen = [v for v in (result.get("nvml_process_peak"), doc.get("process_peak_bytes")) if v]
    measured = max(seen) if seen else result.get("nvml_device_delta_peak")
    return {"measured_process_peak": measured, "run_process_peak": doc.get("process_peak_bytes"),
            "nvml_process_peak": result.get("nvml_process_peak"),
            "nvml_device_delta_peak": result.get("nvml_device_delta_peak"),
            "allocated_peak": doc["peak_allocated_bytes"], "reserved_peak": doc.get("peak_reserved_bytes"),
            "reserved_sampled_peak": doc["telemetry"].get("torch_reserved_peak"),
            "allocator_cap": doc.get("allocator_cap_bytes"), "context_bytes": doc.get("context_bytes"),
            "steps_s": steps, "steady_step_s": statistics.median(steps[1:]) if len(steps) > 1 else steps[0],
            "phases": doc["phases"], "vae_decode_peak_bytes": doc.get("vae_decode_peak_bytes"),
            "telemetry_peaks": {k: v for k, v in doc["telemetry"].items() if k != "final"},
            "oom_step_downs": doc.get("oom_step_downs", []),
            "forecast_check": doc.get("forecast_check")}


def one_card(args: argparse.Namespace, card: float, root: Path) -> dict[str, Any]:
    cache = root / f"card-{card:g}"
    cache.mkdir(parents=True, exist_ok=True)
    budget = "auto" if args.auto else f"{card:g}GB"
    entry: dict[str, Any] = {"card_gb": card, "budget": budget, "rounds": []}
    with ballast(card, args.gpu) as held:
        entry["ballast"] = {"free_cuda": held.free_cuda, "free_nvml": held.free_nvml, "held": held.held}
        for round_ in range(2 if args.repeat else 1):
            plan = cli(args, "plan", budget, cache, [], args.gpu)
            record: dict[str, Any] = {"round": round_ + 1}
            if plan["returncode"] != 0:
                record["plan_error"] = plan.get("error")
                log(f"{card:g} GB: plan refused: {plan.get('error')}")
                entry["rounds"].append(record)
                break
            record["plan"] = summarize_plan(plan["doc"])
            log(f"{card:g} GB round {round_ + 1}: plan {record['plan']['policy']}, predicted "
                f"{_gb(record['plan']['predicted_process_peak'])} ({record['plan']['peak_source']}), step "
                f"{record['plan']['predicted_step_s']} s")
            run = cli(args, "run", budget, cache, [], args.gpu)
            if run["returncode"] != 0:
                record["run_error"] = run.get("error")
                record["stderr_tail"] = run.get("stderr_tail")
                record["run_nvml"] = {k: run.get(k) for k in ("nvml_process_peak", "nvml_device_delta_peak")}
                log(f"{card:g} GB: run failed: {run.get('error')}")
            else:
                record["run"] = summarize_run(run)
                record["profiles"] = recorded_profiles(cache)
                log(f"{card:g} GB round {round_ + 1}: measured {_gb(record['run']['measured_process_peak'])}, "
                    f"step {record['run']['steady_step_s']:.3f} s, step-downs {len(record['run']['oom_step_downs'])}")
            entry["rounds"].append(record)
            if round_ == 0 and args.configs and "plan" in record:
                entry["configs"] = configs(args, card, cache.parent / f"cfg-{card:g}", plan["doc"])
            if round_ == 0 and args.alternatives and "plan" in record:
                entry["alternatives"] = alternatives(args, card, cache.parent / f"alt-{card:g}", plan["doc"], record)
    return entry


def policy_flags(policy: dict[str, Any], resident: int, slots: int | None = None) -> list[str]:
    """The plan's policy as explicit flags, with `resident` blocks (and `slots`, default the plan's;
    no budget: the policy as given)."""
    flags = ["--dlo-offload-components", json.dumps(policy["dlo_offload_components"]),
             "--resident-layers", str(resident), "--placement", policy["placement"],
             "--prefetch-slots", str(slots or policy["prefetch_slots"])]
    for name in ("stream_encoders", "vae_tiling", "vae_slicing", "ff_chunking"):
        flags += [f"--{name.replace('_', '-')}", "off" if policy[name] == "auto" else policy[name]]
    return flags


def fits(run: dict[str, Any], card: float) -> bool:
    """Ran to the end, inside the card (NVML per process), with no OOM step-down."""
    return (bool(run) and not run.get("oom_step_downs")
            and (run.get("measured_process_peak") or float("inf")) <= card * GB)


def alternatives(args: argparse.Namespace, card: float, cache: Path, plan_doc: dict[str, Any],
                 record: dict[str, Any]) -> dict[str, Any]:
    """The planner's policy with more or fewer resident blocks, run under the same card without a budget:
    the best measured configuration that fits the card, and the planner's step against it (a delta of 0:
    the planner's own policy without the budget, which shows what the budget's own settings cost)."""
    policy, blocks = plan_doc["policy"], plan_doc["forecast"]["num_resident_blocks"] + \
        plan_doc["forecast"]["num_streamed_blocks"]
    chosen = int(policy["resident_layers"] or 0)
    tried: list[dict[str, Any]] = []
    cache.mkdir(parents=True, exist_ok=True)  # its own: the profiles of these runs must not feed --repeat
    for delta in args.alternatives:
        resident = min(blocks, max(0, chosen + delta))
        if (resident == chosen and delta != 0) or any(t["resident"] == resident for t in tried):
            continue
        run = cli(args, "run", None, cache, policy_flags(policy, resident), args.gpu)
        row: dict[str, Any] = {"resident": resident}
        if run["returncode"] != 0:
            row["error"] = run.get("error")
        else:
            row.update(summarize_run(run))
            row["profiles"] = recorded_profiles(cache)  # this run's (same size: each run rewrites it)
        row["fits"] = "error" not in row and fits(row, card)
        tried.append(row)
        log(f"{card:g} GB alternative {resident} resident: "
            + (f"failed: {row['error']}" if "error" in row else
               f"{_gb(row['measured_process_peak'])}, step {row['steady_step_s']:.3f} s, fits {row['fits']}"))
    planner = record.get("run") or {}
    fitting = [t["steady_step_s"] for t in tried if t["fits"]]
    if planner and fits(planner, card):
        fitting.append(planner["steady_step_s"])
    best = min(fitting, default=None)
    out = {"chosen_resident": chosen, "tried": tried, "best_fitting_step_s": best,
           "planner_over_best": planner["steady_step_s"] / best if planner and best else None}
    log(f"{card:g} GB: planner {planner.get('steady_step_s')} s vs best fitting {best} s: "
        f"{out['planner_over_best']}")
    return out


def configs(args: argparse.Namespace, card: float, cache: Path, plan_doc: dict[str, Any]) -> dict[str, Any]:
    """`--configs R:K ...`: the plan's policy with R resident blocks and K ring slots, each run `--rounds`
    times in turn under the same card (no budget), so that two close configurations are told apart by
    more than one run's noise: every run's steady steps, and each configuration's median over all."""
    cache.mkdir(parents=True, exist_ok=True)
    pairs = [tuple(int(x) for x in c.split(":")) for c in args.configs]
    steps: dict[str, list[float]] = {f"{r}:{k}": [] for r, k in pairs}
    runs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for resident, slots in pairs:
            run = cli(args, "run", None, cache, policy_flags(plan_doc["policy"], resident, slots), args.gpu)
            row: dict[str, Any] = {"config": f"{resident}:{slots}", "round": round_ + 1}
            if run["returncode"] != 0:
                row["error"] = run.get("error")
            else:
                row.update(summarize_run(run))
                steps[row["config"]] += row["steps_s"][1:]
            row["fits"] = "error" not in row and fits(row, card)
            runs.append(row)
            log(f"{card:g} GB config {row['config']} round {round_ + 1}: " + (
                f"failed: {row['error']}" if "error" in row else
                f"{_gb(row['measured_process_peak'])}, steps {[round(s, 4) for s in row['steps_s'][1:]]}"))
    medians = {c: statistics.median(v) if v else None for c, v in steps.items()}
    log(f"{card:g} GB configs, median steady step: {medians}")
    return {"runs": runs, "median_step_s": medians,
            "fits": {c: all(r["fits"] for r in runs if r["config"] == c) for c in steps}}


def _gb(n: float | None) -> str:
    return "-" if n is None else f"{n / GB:.2f} GB"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.3f}"


def table(report: dict[str, Any]) -> str:
    head = ("card", "round", "policy", "lean", "pred peak", "meas peak", "meas/pred", "peak/card", "pred step",
            "meas step", "meas/pred", "vs resident", "OOM")
    rows = [head]
    resident = (report.get("resident") or {}).get("steady_step_s")
    for entry in report["cards"]:
        for r in entry["rounds"]:
            p, m = r.get("plan") or {}, r.get("run") or {}
            if not p:
                rows.append((f"{entry['card_gb']:g} GB", str(r["round"]), f"refused: {r.get('plan_error', '')}"[:60],
                             *("",) * 10))
                continue
            card = entry["card_gb"] * GB
            rows.append((f"{entry['card_gb']:g} GB", str(r["round"]), p["policy"], ";".join(p["lean"]) or "-",
                         _gb(p["predicted_process_peak"]), _gb(m.get("measured_process_peak")) if m else "failed",
                         _ratio(m.get("measured_process_peak"), p["predicted_process_peak"]),
                         _ratio(m.get("measured_process_peak"), card),
                         "-" if p["predicted_step_s"] is None else f"{p['predicted_step_s']:.3f} s",
                         "-" if not m else f"{m['steady_step_s']:.3f} s",
                         _ratio(m.get("steady_step_s"), p["predicted_step_s"]),
                         _ratio(m.get("steady_step_s"), resident),
                         str(len(m.get("oom_step_downs", []))) if m else r.get("run_error", "")[:40]))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=sorted(SIZES), required=True)
    parser.add_argument("--dir", type=Path, required=True, help="the model directory (written if missing)")
    parser.add_argument("--cards", type=float, nargs="+", default=[8, 12, 16, 24])
    parser.add_argument("--auto", action="store_true", help="--vram-budget auto instead of the card's size")
    parser.add_argument("--repeat", action="store_true", help="plan and run again after the first request")
    parser.add_argument("--resident-reference", action="store_true", help="one --mode resident run, no ballast")
    parser.add_argument("--alternatives", type=int, nargs="*", default=[],
                        help="also run the planner's policy with this many more (or fewer, negative) resident "
                             "blocks under the same card, no budget: the best measured configuration that fits")
    parser.add_argument("--configs", nargs="*", default=[], metavar="R:K",
                        help="also run the planner's policy with R resident blocks and K ring slots under the "
                             "same card, no budget, --rounds times each in turn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--guidance", type=float, default=None)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--out", default="real_cards.json")
    args = parser.parse_args()
    write_model(args.kind, args.dir)
    report: dict[str, Any] = {"kind": args.kind, "size": SIZES[args.kind], "date": time.strftime("%Y-%m-%d"),
                              "args": {k: str(v) for k, v in vars(args).items()}, "cards": []}
    with tempfile.TemporaryDirectory(prefix="real-cards-") as tmp:
        root = Path(tmp)
        if args.resident_reference:
            (root / "resident").mkdir()
            ref = cli(args, "run", None, root / "resident", ["--mode", "resident"], args.gpu)
            report["resident"] = summarize_run(ref) if ref["returncode"] == 0 else {"error": ref.get("error")}
            report["resident_profiles"] = recorded_profiles(root / "resident")
            log(f"resident: {report['resident']}")
        for card in args.cards:
            report["cards"].append(one_card(args, card, root))
            Path(args.out).write_text(json.dumps(report, indent=2))  # partial results survive a later failure
    text = table(report)
    for entry in report["cards"]:
        alt = entry.get("alternatives")
        if alt:
            text += (f"\n{entry['card_gb']:g} GB: planner {alt['chosen_resident']} resident; best fitting step "
                     f"{alt['best_fitting_step_s']}; planner / best {alt['planner_over_best']}")
    report["table"] = text
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(text, flush=True)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
