"""What the process's own host memory is: the RSS that no plan names (issue 35's no-waste and host forecast).

A `run` holds its pinned blocks, staged masters and bounce rings, and the process itself: python, torch,
diffusers, transformers, the CUDA context's host side, the kernel libraries and the heap. The host forecast calls
the last one the process base RSS. This measures it two ways:

- `stages` (one fresh child per `CUDA_MODULE_LOADING` mode): RSS (anonymous and file-backed) after each step a
  request takes for the first time: importing torch, creating the CUDA context, a bf16 matmul (cuBLAS/cuBLASLt),
  attention (SDPA), elementwise and norm kernels, a convolution (cuDNN), importing transformers and diffusers and
  a pipeline class, importing the engine; then the largest mappings;
- `run`: `omni-console run` in this process with a sampler thread reading RSS and the engine's own count of
  page-locked and arena bytes every `--interval` seconds, so `RSS - arenas` (what the process holds beyond what
  the plan names) is known per phase, at the RSS peak and at the end. `--phases` prints each phase's largest
  RSS split into anonymous, file-backed and shared memory beside the arenas (issue 35: which kind a gap is);
- `resident`: the resident blocks of a load without masters (`run --ram-budget`) on a CPU: each read from its
  files into the host tensors the DiT was built with and moved off the host (re-pointed at storage outside the
  heap, as a GPU copy leaves it), once as the engine does (`move_resident`: its pages given back per block)
  and once untrimmed (the load before that fix); the RSS each left behind.

    python -m benchmarks.process_rss stages --out process_rss_stages.json
    python -m benchmarks.process_rss run --phases --out process_rss_run.json -- --model /tmp/flux-size --steps 2
    python -m benchmarks.process_rss resident --model /tmp/flux-small --out process_rss_resident.json

Everything after `--` goes to `run` unchanged (its `--output` defaults to a temporary file).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.host_rss_breakdown import largest_mappings

GB = 1e9
_STATUS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")


def status() -> dict[str, int]:
    """This process's RSS fields (bytes) from /proc/self/status."""
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in _STATUS:
            out[key] = int(rest.split()[0]) * 1024
    return out


def _stage_steps(device: str) -> list[tuple[str, Any]]:
    """(name, callable) in the order a request meets them for the first time."""

    def cuda_context() -> None:
        import torch

        torch.zeros(1, device=device)
        torch.cuda.synchronize()

    def matmul() -> None:
        import torch

        a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
        (a @ a).sum().item()

    def attention() -> None:
        import torch
        import torch.nn.functional as F

        q = torch.randn(1, 24, 4096, 128, device=device, dtype=torch.bfloat16)
        F.scaled_dot_product_attention(q, q, q).sum().item()

    def elementwise() -> None:
        import torch
        import torch.nn.functional as F

        x = torch.randn(4096, 3072, device=device, dtype=torch.bfloat16)
        F.gelu(F.layer_norm(x, (3072,)), approximate="tanh").sum().item()
        F.silu(x).softmax(-1).sum().item()
        (x * 2 + 1).float().mean().item()

    def conv() -> None:
        import torch
        import torch.nn.functional as F

        x = torch.randn(1, 128, 256, 256, device=device, dtype=torch.bfloat16)
        w = torch.randn(128, 128, 3, 3, device=device, dtype=torch.bfloat16)
        y = F.group_norm(F.conv2d(x, w, padding=1), 32)
        F.interpolate(y, scale_factor=2.0, mode="nearest").sum().item()

    def libraries() -> None:
        import diffusers  # noqa: F401
        import transformers  # noqa: F401
        from diffusers import FluxPipeline  # noqa: F401

    def engine() -> None:
        from omni_console.engine import engine as _engine  # noqa: F401

    def nvml() -> None:
        import pynvml

        pynvml.nvmlInit()

    steps: list[tuple[str, Any]] = [("import torch", lambda: __import__("torch"))]
    if device != "cpu":
        steps.append(("CUDA context", cuda_context))
    steps += [("matmul bf16 (cuBLAS)", matmul), ("attention (SDPA)", attention), ("elementwise, norms", elementwise),
              ("conv, group norm (cuDNN)", conv), ("import transformers, diffusers, FluxPipeline", libraries),
              ("import the engine", engine)]
    if device != "cpu":
        steps.append(("NVML", nvml))
    return steps


def stages_child(device: str) -> dict[str, Any]:
    """Walk the stages in this (fresh) process; each stage's RSS and seconds."""
    rows = [{"stage": "python", **status(), "seconds": 0.0}]
    for name, step in _stage_steps(device):
        t0 = time.perf_counter()
        step()
        rows.append({"stage": name, **status(), "seconds": round(time.perf_counter() - t0, 3)})
    import torch

    env = {k: os.environ.get(k) for k in ("CUDA_MODULE_LOADING", "LD_PRELOAD", "MALLOC_ARENA_MAX")}
    return {"device": device, "env": env, "torch": torch.__version__,
            "cuda": getattr(torch.version, "cuda", None), "stages": rows, "mappings": largest_mappings(os.getpid(), 25)}


def run_stages(args: argparse.Namespace) -> dict[str, Any]:
    """One fresh child per module-loading mode (CPU: one)."""
    modes = ["LAZY", "EAGER"] if args.device != "cpu" else [None]
    out: dict[str, Any] = {}
    for mode in modes:
        env = {**os.environ}
        if mode:
            env["CUDA_MODULE_LOADING"] = mode
        code = (f"import json, sys; from benchmarks.process_rss import stages_child; "
                f"print(json.dumps(stages_child({args.device!r})))")
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        if done.returncode:
            out[mode or "cpu"] = {"error": done.stderr.strip().splitlines()[-5:]}
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        out[mode or "cpu"] = result
        print(f"{mode or 'cpu'}:")
        prev = 0
        for row in result["stages"]:
            print(f"  {row['stage']:<46} RSS {row['VmRSS'] / GB:6.3f} GB (+{(row['VmRSS'] - prev) / GB:6.3f}) anon "
                  f"{row['RssAnon'] / GB:6.3f} file {row['RssFile'] / GB:6.3f}  {row['seconds']:.2f} s")
            prev = row["VmRSS"]
    return out


class Sampler:
    """RSS and the engine's arena/pinned counts every `interval` s, each sample tagged with the last progress line."""

    def __init__(self, interval: float) -> None:
        from omni_console.offload.pinned import arena_bytes_held, pinned_bytes_held

        self._arenas, self._pinned = arena_bytes_held, pinned_bytes_held
        self.interval, self.t0 = interval, time.perf_counter()
        self.samples: list[dict[str, Any]] = []
        self.phase = "start"
        self.peak_mappings: list[dict[str, Any]] = []
        self._best = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rss-sampler")

    def sample(self) -> dict[str, Any]:
        row = {"t": round(time.perf_counter() - self.t0, 3), "phase": self.phase, **status(),
               "arena": self._arenas(), "pinned": self._pinned()}
        row["outside_arenas"] = row["VmRSS"] - row["arena"]
        self.samples.append(row)
        if row["VmRSS"] > self._best + 0.25 * GB:
            self._best = row["VmRSS"]
            self.peak_mappings = largest_mappings(os.getpid(), 25)
        return row

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()


class _Tee:
    """stderr that also names the sampler's phase after each progress line."""

    def __init__(self, stream: Any, sampler: Sampler) -> None:
        self._stream, self._sampler = stream, sampler

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                self._sampler.phase = line.strip()[:120]
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def run_in_process(args: argparse.Namespace) -> dict[str, Any]:
    """`omni-console run` here, sampled (see the module docstring)."""
    from omni_console.console.cli import main as cli_main

    argv = list(args.run_args)
    if "--output" not in argv:
        argv += ["--output", str(Path(tempfile.mkdtemp()) / "out.png"), "--overwrite"]
    before = status()
    with Sampler(args.interval) as sampler:
        real = sys.stderr
        sys.stderr = _Tee(real, sampler)  # type: ignore[assignment]
        try:
            code = cli_main(["run", *argv])
        finally:
            sys.stderr = real
    from omni_console.offload.process_memory import release_freed_heap

    samples = sampler.samples
    before_trim = status()["VmRSS"]
    # what the C heap still held free at the end (the engine trims after each phase); None: no glibc to ask
    trimmed = before_trim - status()["VmRSS"] if release_freed_heap() else None
    peak = max(samples, key=lambda s: s["VmRSS"])
    by_phase = phase_maxima(samples)
    report = {"argv": argv, "returncode": code, "before": before, "peak": peak, "end": samples[-1],
              "end_heap_released": trimmed, "end_after_trim": status(),
              "outside_arenas_max": max(s["outside_arenas"] for s in samples), "by_phase": by_phase,
              "peak_mappings": sampler.peak_mappings, "end_mappings": largest_mappings(os.getpid(), 25),
              "samples": samples[:: max(1, len(samples) // 300)]}
    print(f"peak RSS {peak['VmRSS'] / GB:.3f} GB at {peak['t']} s ({peak['phase']}): arenas {peak['arena'] / GB:.3f}, "
          f"outside {peak['outside_arenas'] / GB:.3f} (anon {peak['RssAnon'] / GB:.3f}, "
          f"file {peak['RssFile'] / GB:.3f})"
          f"; outside the arenas at most {report['outside_arenas_max'] / GB:.3f} GB; at the end "
          f"{samples[-1]['outside_arenas'] / GB:.3f} GB (then malloc_trim released {(trimmed or 0) / GB:.3f} GB)",
          flush=True)
    if args.phases:
        print_phases(by_phase)
    return report


PHASE_FIELDS = (("rss", "VmRSS"), ("anon", "RssAnon"), ("file", "RssFile"), ("shmem", "RssShmem"),
                ("arena", "arena"), ("pinned", "pinned"), ("outside_arenas", "outside_arenas"))


def phase_maxima(samples: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Each phase's (last progress line's) largest figure of each kind, in the order the phases came."""
    by_phase: dict[str, dict[str, int]] = {}
    for s in samples:
        slot = by_phase.setdefault(s["phase"], dict.fromkeys((key for key, _ in PHASE_FIELDS), 0))
        for key, field in PHASE_FIELDS:
            slot[key] = max(slot[key], s.get(field, 0))
    return by_phase


def print_phases(by_phase: dict[str, dict[str, int]]) -> None:
    """One row a phase: where the RSS peak of each kind was (GB)."""
    print(f"{'phase (largest of each, GB)':<60}" + "".join(f"{key:>15}" for key, _ in PHASE_FIELDS))
    for phase, row in by_phase.items():
        print(f"{phase[:58]:<60}" + "".join(f"{row[key] / GB:>15.3f}" for key, _ in PHASE_FIELDS))


def resident_heap(args: argparse.Namespace) -> dict[str, Any]:
    """`resident` (module docstring): each DiT block of `--model` read and moved off the host, trimmed and not."""
    import torch

    from omni_console.engine.model_dir.discovery import discover_model
    from omni_console.offload import resident_blocks
    from omni_console.offload.block_packing import Block, unique_tensors
    from omni_console.offload.deferred_weights import DeferredWeights
    from omni_console.offload.devices import rebind

    def off_host(tensors: list[torch.Tensor], _device: torch.device) -> int:
        for t in tensors:
            rebind(t, lambda t=t: torch.zeros((), dtype=t.dtype).expand(t.shape))
        return sum(t.numel() * t.element_size() for t in tensors)

    def untrimmed(b: Block, weights: DeferredWeights | None, device: torch.device) -> int:
        assert weights is not None
        weights.materialize_module(b.module)
        return off_host(unique_tensors(b.module), device)

    info = next(c for c in discover_model(args.model).components if c.role == "dit" and c.block_lists)
    out: dict[str, Any] = {"model": str(args.model), "component": info.name}
    real_move = resident_blocks.move_preserving_aliases
    resident_blocks.move_preserving_aliases = off_host  # type: ignore[assignment]  # a GPU copy, as the host sees it
    try:
        for mode, move in (("untrimmed", untrimmed), ("move_resident", resident_blocks.move_resident)):
            out[mode] = _moved_blocks(info, mode, move)
    finally:
        resident_blocks.move_preserving_aliases = real_move
    return out


def _moved_blocks(info: Any, mode: str, move: Any) -> dict[str, Any]:
    """Every block of `info` built empty, then read and moved by `move`; the anonymous RSS each left behind."""
    import ctypes

    import torch

    from omni_console.engine.loading.direct_load import build_deferred
    from omni_console.offload.block_packing import Block
    from omni_console.offload.deferred_weights import DeferredWeights

    weights = DeferredWeights(4)
    try:
        module, why = build_deferred(info, torch.bfloat16, weights)
        if module is None:
            raise SystemExit(f"{info.name}: {why}")
        rows, start = [], status()["RssAnon"]
        for b in info.block_lists:
            for i, m in enumerate(getattr(module, b.attr)):
                moved = move(Block(f"{b.attr}.{i}", m, resident=True), weights, torch.device("cpu"))
                rows.append({"block": f"{b.attr}.{i}", "bytes": moved, "anon_left": status()["RssAnon"] - start})
    finally:
        weights.close()
    ctypes.CDLL(None).malloc_trim(0)
    most = max(r["anon_left"] for r in rows)  # the last free may reach the heap's top: glibc trims it there
    result = {"blocks": rows, "left_at_most": most, "left_after_all": rows[-1]["anon_left"],
              "left_after_trim": status()["RssAnon"] - start}
    steps = [r["anon_left"] - (rows[k - 1]["anon_left"] if k else 0) for k, r in enumerate(rows)]
    print(f"{mode}: " + ", ".join(f"{r['block']} +{d / 1e6:.1f}" for r, d in zip(rows, steps, strict=True))
          + f" MB; at most {most / 1e6:.1f} MB left behind, {rows[-1]['anon_left'] / 1e6:.1f} MB after the last "
          f"(after malloc_trim {result['left_after_trim'] / 1e6:.1f})", flush=True)
    return result


def main() -> None:
    parser = harness.parser(__doc__, out="process_rss.json")
    parser.add_argument("what", choices=["stages", "run", "resident"])
    parser.add_argument("--device", default="cuda", help="stages: the device (cuda or cpu)")
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--phases", action="store_true", help="run: print each phase's RSS by kind")
    parser.add_argument("--model", type=Path, help="resident: the model directory whose DiT blocks are moved")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.run_args = argv[cut + 1 :]  # everything after `--` is run's
    what = {"stages": run_stages, "run": run_in_process, "resident": resident_heap}[args.what]
    report = what(args)
    harness.write({"what": args.what, **report}, args)


if __name__ == "__main__":
    main()
