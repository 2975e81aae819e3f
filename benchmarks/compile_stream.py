"""Regional compile on streamed blocks (issue 40), ratios in one run on one GPU.

One DiT (random bf16 weights; Flux-dev-size at 1024², Wan2.1-14B-size at 81x480x832, or the small presets for a
CPU smoke run) is run:
  resident eager          the plain model on the device: the baseline of every ratio
  resident compiled       diffusers' own `transformer.compile_repeated_blocks(fullgraph=True, dynamic=False)` on
                          the resident model: the exactness reference (and compiled resident speed)
Then for each `--budgets` value (GB, a simulated card) the planner's streaming choice for that budget
(`engine/planning/stream_choice.choose_streaming`, as `--vram-budget` plans it) is carried out by one streamer
that keeps its masters, re-planned in place from budget to budget (a live re-plan), and run
  streamed eager          our streamer, uncompiled
  streamed compiled       our streamer with `offload/block_compile.CompiledBlocks` (`--compile regional`)
Printed per budget: compiled step / resident eager, compiled step / streamed eager (the link-bound check: compile
must never slow a transfer-bound plan), the plan's bound (compute or transfer), Dynamo's compiles and recompiles
after warm-up (across the re-plans: 0 expected), bit-identity with diffusers' compiled resident output, and the
max |compiled - eager|.
`--stream-dtype float8_e4m3fn` also streams fp8 storage (every block in the ring; the upcast runs in the ring's
hook beside the graph) uncompiled and compiled, reported against both the fp8 uncompiled step and resident eager.
`--phases` also times the compile phase in two fresh processes sharing one empty Inductor cache dir (cold, then
warm) and prints warm / cold (target <= 0.10), for each of `--phase-paths`: `ours` (the engine's `RegionalCompile`,
what `run --compile regional` does) and `diffusers` (`compile_repeated_blocks`; the report's top-level keys), each
with its graphs, cache hits and Dynamo's compile timers (where a warm start's seconds go).

Usage: python -m benchmarks.compile_stream --model flux --budgets 24 8 --phases --out compile_stream.json
       python -m benchmarks.compile_stream --model wan --budgets 8 16 --iters 2
       (`--device cpu --model flux-small --backend eager --budgets 0.001` smoke-runs the script itself;
        `--device cpu --model flux-small --backend inductor --budgets --phases --text-tokens 32` the phases.)
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from omni_console.engine.device_probes import measure_h2d_bandwidth
from omni_console.engine.loading.stream_dtype import STREAM_DTYPES, cast_for_storage
from omni_console.engine.planning.compile_choice import WORKSPACE_SHARE
from omni_console.engine.planning.stream_choice import choose_streaming, profile_from_timings
from omni_console.offload.block_compile import CompiledBlocks, CompileSettings, CompileWatch, repeated_blocks
from omni_console.offload.block_timing import BlockTimer
from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer
from omni_console.offload.upcast import module_upcast

from . import harness
from .budget_sweep import MODELS, blocks_of, build, inputs_for, log, peak, peak_reset, sync, timed_forwards

GB = 1e9


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def _module_bytes(m: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()])


def _uncompile(model: torch.nn.Module) -> None:
    """Undo diffusers' `compile_repeated_blocks` (it sets each block's `_compiled_call_impl`)."""
    for m in model.modules():
        if getattr(m, "_compiled_call_impl", None) is not None:
            m._compiled_call_impl = None


def _first_forward_s(model: torch.nn.Module, inputs: dict[str, Any], device: torch.device) -> float:
    with torch.no_grad():
        t0 = time.perf_counter()
        model(**inputs)
        sync(device)
    return time.perf_counter() - t0


def resident_runs(spec: dict[str, Any], model: torch.nn.Module, inputs: dict[str, Any], device: torch.device,
                  args: Any) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """(figures, eager output, diffusers-compiled output) of the resident model."""
    weights = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    peak_reset(device)
    eager_s, _, eager_out = timed_forwards(model, inputs, device, args.iters)
    activation = peak(device) - weights
    model.compile_repeated_blocks(backend=args.backend, fullgraph=True, dynamic=False)
    before = CompileWatch.snapshot()
    peak_reset(device)
    first = _first_forward_s(model, inputs, device)
    compiling = peak(device) - weights  # the forward that compiles: Inductor's autotuning and benchmark buffers too
    peak_reset(device)
    compiled_s, _, compiled_out = timed_forwards(model, inputs, device, args.iters, warmup=1)
    compiled_activation = peak(device) - weights
    done = CompileWatch.snapshot() - before
    _uncompile(model)
    largest_block = max(_module_bytes(b) for _, bl in blocks_of(model, spec["kind"]) for b in bl)
    figures = {"eager_step_s": eager_s, "compiled_step_s": compiled_s,
               "compiled_over_eager": harness.ratio(compiled_s, eager_s), "first_compiled_forward_s": first,
               "compile_s": done.seconds, "compiles": done.compiles, "activation_bytes": activation,
               "weights_bytes": weights, "max_abs_diff_compiled_vs_eager": _max_diff(compiled_out, eager_out),
               # issue 40's compile workspace: what the compiling forward held above the eager one's peak, against
               # the forecast's estimate (engine/planning/compile_choice.py WORKSPACE_SHARE x the largest block)
               "compiling_forward_peak_bytes": compiling, "compiled_activation_bytes": compiled_activation,
               "compile_workspace_bytes": max(0, compiling - activation),
               "workspace_estimate_bytes": int(WORKSPACE_SHARE * largest_block)}
    log(f"resident eager {eager_s:.4f} s, compiled (diffusers) {compiled_s:.4f} s "
        f"({figures['compiled_over_eager']}x), compile {done.seconds:.1f} s; compile workspace "
        f"{figures['compile_workspace_bytes'] / GB:.3f} GB (estimated {figures['workspace_estimate_bytes'] / GB:.3f})")
    return figures, eager_out, compiled_out


def profile_of(model: torch.nn.Module, inputs: dict[str, Any], device: torch.device, blocks: list[torch.nn.Module],
               eager_s: float, activation: int) -> Any:
    timer = BlockTimer(blocks, device)
    with torch.no_grad():
        model(**inputs)
        model(**inputs)
        sync(device)
    compute, _ = timer.take()
    timer.remove()
    block_bytes = tuple(_module_bytes(b) for b in blocks)
    return profile_from_timings(block_bytes, compute, eager_s, 1, activation), block_bytes


def streamed_runs(spec: dict[str, Any], model: torch.nn.Module, inputs: dict[str, Any], device: torch.device,
                  args: Any, eager_s: float, activation: int, eager_out: torch.Tensor,
                  compiled_ref: torch.Tensor) -> list[dict[str, Any]]:
    lists = blocks_of(model, spec["kind"])
    blocks = [b for _, bl in lists for b in bl]
    profile, block_bytes = profile_of(model, inputs, device, blocks, eager_s, activation)
    non_block = _module_bytes(model) - sum(block_bytes)
    for b in blocks:
        b.to("cpu")
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    bw = measure_h2d_bandwidth(device) or 10 * GB
    log(f"bandwidth {bw / GB:.1f} GB/s")
    streamer: LayerwiseStreamer | None = None
    compiled: CompiledBlocks | None = None
    rows: list[dict[str, Any]] = []
    warm_mark = None
    for budget_gb in args.budgets:
        choice, smallest = choose_streaming(profile, bw, non_block, int(budget_gb * GB))
        if choice is None:
            choice = smallest
            log(f"budget {budget_gb} GB: nothing fits; the smallest peak ({smallest.peak_bytes / GB:.2f} GB) instead")
        r = choice.residency
        if streamer is None:
            streamer = LayerwiseStreamer(lists, device, residency=r, keep_masters=True)
            streamer.attach()
        else:
            if compiled is not None:
                compiled.remove()
                compiled = None
            streamer.replan(r)  # a live re-plan: another budget in the same process
        transfer_s = sum(b for b, res in zip(block_bytes, r.resident, strict=True) if not res) / bw
        compute_s = sum(profile.compute_s) + profile.other_s
        bound = "transfer" if transfer_s > compute_s else "compute"
        peak_reset(device)
        eager_stream_s, _, out_eager = timed_forwards(model, inputs, device, args.iters)
        compiled = CompiledBlocks(repeated_blocks(model), CompileSettings(backend=args.backend))
        first_mark = CompileWatch.snapshot()
        with torch.no_grad():
            model(**inputs)  # warm-up: the first call per block class and shape (compiled earlier if resident ran)
        sync(device)
        mark = CompileWatch.snapshot()
        warm_mark = warm_mark or mark
        compiled_s, _, out_compiled = timed_forwards(model, inputs, device, args.iters, warmup=1)
        after = CompileWatch.snapshot() - mark
        row = {"budget_gb": budget_gb, "resident_blocks": r.num_resident, "slots": r.slots, "bound": bound,
               "predicted_step_s": choice.step_s, "transfer_s": transfer_s, "compute_s": compute_s,
               "peak_allocated": peak(device), "eager_stream_step_s": eager_stream_s, "compiled_step_s": compiled_s,
               "compiled_over_resident_eager": harness.ratio(compiled_s, eager_s),
               "compiled_over_stream_eager": harness.ratio(compiled_s, eager_stream_s),
               "warmup_compiles": (mark - first_mark).compiles,
               "compiles_after_warmup": after.compiles, "recompiles_after_warmup": after.recompiles,
               "graph_breaks": after.graph_breaks,
               "stream_eager_equals_resident_eager": bool(torch.equal(out_eager, eager_out)),
               "equals_diffusers_regional_compile": bool(torch.equal(out_compiled, compiled_ref)),
               "max_abs_diff_vs_diffusers_compiled": _max_diff(out_compiled, compiled_ref),
               "max_abs_diff_vs_eager": _max_diff(out_compiled, eager_out)}
        rows.append(row)
        log(f"budget {budget_gb} GB: {r.num_resident} resident, {r.slots} slots, {bound}-bound; compiled "
            f"{compiled_s:.4f} s = {row['compiled_over_resident_eager']}x resident eager, "
            f"{row['compiled_over_stream_eager']}x streamed eager; compiles in warm-up {row['warmup_compiles']}, "
            f"recompiles after warm-up "
            f"{after.recompiles}; equal to diffusers' compile: {row['equals_diffusers_regional_compile']}")
    if warm_mark is not None:
        total = CompileWatch.snapshot() - warm_mark
        rows.append({"across_replans": True, "compiles_after_first_warmup": total.compiles,
                     "recompiles_after_first_warmup": total.recompiles})
        log(f"across {len(args.budgets)} budgets and re-plans: {total.compiles} compiles after the first warm-up")
    if compiled is not None:
        compiled.remove()
    if streamer is not None:
        streamer.detach()
    return rows


def _inputs(spec: dict[str, Any], device: torch.device, text_tokens: int | None) -> dict[str, Any]:
    inputs = inputs_for(spec, device)
    if text_tokens:
        inputs["encoder_hidden_states"] = inputs["encoder_hidden_states"][:, :text_tokens].contiguous()
        if "txt_ids" in inputs:
            inputs["txt_ids"] = inputs["txt_ids"][:text_tokens].contiguous()
    return inputs


def fp8_runs(spec: dict[str, Any], inputs: dict[str, Any], device: torch.device, args: Any, eager_s: float,
             eager_out: torch.Tensor) -> dict[str, Any]:
    """fp8 storage streamed (every block in the ring, upcast beside the graph by the ring's hooks), uncompiled and
    compiled: the compiled step against both the fp8 uncompiled step and the resident bf16 eager step."""
    storage = STREAM_DTYPES[args.stream_dtype]
    model = build(spec, device)
    cast_for_storage(model, storage)
    lists = blocks_of(model, spec["kind"])
    attrs = {a for a, _ in lists}
    for name, child in model.named_children():
        if name not in attrs:
            module_upcast(child, torch.bfloat16)  # resident non-block layers: upcast once, as placement does
    for _, bl in lists:
        for b in bl:
            b.to("cpu")
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    n = sum(len(bl) for _, bl in lists)
    streamer = LayerwiseStreamer(lists, device, residency=BlockResidency.leading(n, 0, n),
                                 compute_dtype=torch.bfloat16)
    streamer.attach()
    eager_fp8_s, _, out_eager = timed_forwards(model, inputs, device, args.iters)
    compiled = CompiledBlocks(repeated_blocks(model), CompileSettings(backend=args.backend))
    with torch.no_grad():
        model(**inputs)
    sync(device)
    mark = CompileWatch.snapshot()
    compiled_s, _, out_compiled = timed_forwards(model, inputs, device, args.iters, warmup=1)
    after = CompileWatch.snapshot() - mark
    compiled.remove()
    streamer.detach()
    result = {"stream_dtype": args.stream_dtype, "slots": n, "eager_fp8_step_s": eager_fp8_s,
              "compiled_fp8_step_s": compiled_s,
              "compiled_over_fp8_eager": harness.ratio(compiled_s, eager_fp8_s),
              "compiled_over_resident_bf16_eager": harness.ratio(compiled_s, eager_s),
              "recompiles_after_warmup": after.recompiles, "compiles_after_warmup": after.compiles,
              "max_abs_diff_compiled_vs_fp8_eager": _max_diff(out_compiled, out_eager),
              "max_abs_diff_fp8_eager_vs_bf16_eager": _max_diff(out_eager, eager_out)}
    log(f"fp8 streamed (upcast beside the graph): eager {eager_fp8_s:.4f} s, compiled {compiled_s:.4f} s = "
        f"{result['compiled_over_fp8_eager']}x fp8 eager, {result['compiled_over_resident_bf16_eager']}x resident "
        f"bf16 eager; recompiles after warm-up {after.recompiles}")
    del model, streamer
    gc.collect()
    return result


PHASE_PATHS = ("ours", "diffusers")
CACHE_COUNTERS = ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass", "autograd_cache_hit",
                  "autograd_cache_miss", "autograd_cache_saved", "autograd_cache_bypass")


def _compile_ours(model: torch.nn.Module, device: torch.device, backend: str, warmup: Any = None) -> tuple[Any, float]:
    """The engine's `--compile regional` on `model`: `RegionalCompile` as `Engine.load` builds it (with the
    compile start-up `warmup` it began beside the load), turned on as a request's decision does (`begin`, which
    joins the start-up); returns it and the seconds `begin` waited for the start-up."""
    from omni_console.engine.planning.compile_choice import CompileForecast
    from omni_console.engine.running.request_compile import RegionalCompile

    regional = RegionalCompile("regional", backend, [model], device, warmup)
    mark = regional.begin(CompileForecast("regional", True, "asked", expect="cold"))
    return regional, mark[2]


def phase_only(args: Any) -> None:
    """One fresh process's compile phase (`--phase-only`): the resident model's first compiled forward minus a
    compiled forward after it, through `--phase-path` (ours: the engine's regional compile; diffusers: its
    `compile_repeated_blocks`); printed as one JSON line with Dynamo's graphs, the cache counters and every
    compile timer of 0.05 s or more (`torch._dynamo.utils.compilation_time_metrics`: where the seconds went)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    spec = MODELS[args.model]
    device = torch.device(args.device)
    warmup = None
    if args.phase_path == "ours":  # the engine starts it once the libraries are imported, beside the model's load
        from omni_console.engine.running.request_compile import start_warmup

        warmup = start_warmup("regional", args.backend, device)
    built = time.perf_counter()
    model = build(spec, device)
    inputs = _inputs(spec, device, args.text_tokens)
    built = time.perf_counter() - built
    waited = 0.0
    if args.phase_path == "ours":
        _, waited = _compile_ours(model, device, args.backend, warmup)
    else:
        model.compile_repeated_blocks(backend=args.backend, fullgraph=True, dynamic=False)
    before = CompileWatch.snapshot()  # the start-up's own tiny graph is not the model's
    first = _first_forward_s(model, inputs, device) + waited
    steady = _first_forward_s(model, inputs, device)
    done = CompileWatch.snapshot() - before
    found = {**counters["inductor"], **counters["aot_autograd"]}
    timers = {k: round(sum(v), 3) for k, v in compilation_time_metrics.items() if sum(v) >= 0.05}
    start_up = {"warmup_s": round(warmup.seconds or 0.0, 3), "warmup_waited_s": round(waited, 3),
                "build_s": round(built, 3), "warmup_error": warmup.error} if warmup is not None else {}
    print(json.dumps({"path": args.phase_path, "first_s": first, "steady_s": steady, **start_up,
                      "compile_phase_s": max(first - steady, 0.0), "dynamo_compile_s": done.seconds,
                      "graphs": done.compiles, "recompiles": done.recompiles,
                      "cache": {k: found[k] for k in CACHE_COUNTERS if found.get(k)}, "timers": timers}))


def _phase_pair(args: Any, path: str) -> dict[str, Any]:
    """Cold then warm compile phase through `path`, each in a fresh process, one fresh Inductor cache dir."""
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": str(Path(cache) / "triton")}
        runs = []
        for _ in ("cold", "warm"):
            done = subprocess.run([sys.executable, "-m", "benchmarks.compile_stream", "--phase-only", "--phase-path",
                                   path, "--model", args.model, "--device", args.device, "--backend", args.backend,
                                   *(["--text-tokens", str(args.text_tokens)] if args.text_tokens else [])],
                                  env=env, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                return {"error": done.stderr.strip().splitlines()[-1:] or ["failed"]}
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    result = {"cold": cold, "warm": warm,
              "warm_over_cold": harness.ratio(warm["compile_phase_s"], cold["compile_phase_s"])}
    log(f"{path}: compile phase cold {cold['compile_phase_s']:.2f} s ({cold['graphs']} graphs), warm "
        f"{warm['compile_phase_s']:.2f} s ({warm['graphs']} graphs, {warm['cache']}) ({result['warm_over_cold']}x)")
    return result


def phases(args: Any) -> dict[str, Any]:
    """Each of `--phase-paths`: cold then warm in two fresh processes sharing a cache dir of its own (so no path
    starts warm from another's entries). The top-level keys are diffusers' path (as before); `ours` is the
    engine's regional compile, the path `run --compile regional` takes."""
    result: dict[str, Any] = {}
    for path in args.phase_paths:
        pair = _phase_pair(args, path)
        if path == "diffusers":
            result.update(pair)
        else:
            result[path] = pair
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = harness.parser(__doc__, out="compile_stream.json", device=harness.AUTO, iters=3)
    parser.add_argument("--model", choices=sorted(MODELS), default="flux")
    parser.add_argument("--budgets", type=float, nargs="*", default=[24, 8])
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (eager: a CPU smoke run)")
    parser.add_argument("--phases", action="store_true", help="also time the cold and warm compile phase")
    parser.add_argument("--stream-dtype", choices=sorted(STREAM_DTYPES), default=None,
                        help="also run fp8 storage streamed, uncompiled and compiled (every block in the ring)")
    parser.add_argument("--text-tokens", type=int, default=None,
                        help="fewer text tokens than the preset's 512 (a quicker CPU smoke run)")
    parser.add_argument("--phase-paths", nargs="+", choices=PHASE_PATHS, default=list(PHASE_PATHS),
                        help="paths --phases times (ours: the engine's; diffusers: compile_repeated_blocks)")
    parser.add_argument("--phase-only", action="store_true", help=argparse_hidden())
    parser.add_argument("--phase-path", choices=PHASE_PATHS, default="diffusers", help=argparse_hidden())
    args = parser.parse_args(argv)
    CompileWatch.watch()
    if args.phase_only:
        phase_only(args)
        return {}
    spec = MODELS[args.model]
    device = torch.device(args.device)
    report: dict[str, Any] = {"model": args.model, "backend": args.backend, "budgets_gb": args.budgets,
                              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    if args.budgets or args.stream_dtype:  # `--budgets` with no value and `--phases`: the compile phase alone
        model = build(spec, device)
        inputs = _inputs(spec, device, args.text_tokens)
        report["resident"], eager_out, compiled_ref = resident_runs(spec, model, inputs, device, args)
        report["streamed"] = streamed_runs(spec, model, inputs, device, args, report["resident"]["eager_step_s"],
                                           report["resident"]["activation_bytes"], eager_out, compiled_ref)
        del model
        gc.collect()
        if args.stream_dtype:
            report["fp8"] = fp8_runs(spec, inputs, device, args, report["resident"]["eager_step_s"], eager_out)
    if args.phases:
        report["compile_phase"] = phases(args)
    for key, value in harness.rows({k: v for k, v in report.items() if k != "streamed"}):
        print(f"{key}: {value}")
    harness.write(report, args)
    return report


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
