"""fp8 storage vs bf16, all DiT blocks streamed, in one run on one GPU (issue 26).

A Flux-dev-size transformer (random bf16 weights) runs one forward at 1024² in these ways:
  resident bf16                plain diffusers model on the device (the bf16 compute floor)
  resident layerwise casting   diffusers' enable_layerwise_casting(fp8, bf16): the exactness reference
  compute with upcast          our fp8 path with every block in the ring (no block ever re-copied):
                               each block's fp8 weights upcast before it runs, as when streaming
  DLO bf16                     every block streamed in bf16 (2 slots)
  DLO fp8                      every block streamed in fp8 by diffusers' rule (2 slots)
  DLO fp8 + modulation         the opt-in: AdaLN modulation linears in fp8 too
For each fp8 DLO run: floor = max(compute with upcast, streamed bytes / measured pinned bandwidth),
step / floor, pinned host bytes against bf16's, and bit-identity with the resident model cast the
same way (diffusers' hooks on the same selection). The opt-in's step is also given against the bf16
DLO step of the same run. On CUDA the upcast alone is timed too (`upcast`: fp8 elements per second and
seconds per GB of fp8 weights, the rate engine/planning/upcast_cost.py models).

`--profile` adds, for each DLO run, a pass with CUDA events per block (benchmarks/fp8_profile.py): per
block its copy, its exposed wait + upcast and its compute, and per step the copy, compute, upcast and
link-idle totals, saying whether the step is bound by the link or by compute + upcast.
`--preset wan14b` (Wan2.1-14B size, 81x480x832; `--runs layerwise dlo_fp8`): fp8 storage streamed
against the resident fp8 (layerwise-casting) step. Usage:
  python -m benchmarks.fp8_stream --out fp8_stream.json [--preset flux-dev|small|wan14b|wan-small]
      [--device cuda|cpu] [--runs ...] [--profile]
(`--device cpu --preset small --res 128` is a smoke run of the script itself.)
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import torch

from omni_console.engine.loading.stream_dtype import apply_storage_hooks, cast_for_storage
from omni_console.offload.events import EventBus
from omni_console.offload.pinned import pinned_bytes_held
from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer
from omni_console.offload.upcast import module_upcast

from . import harness
from .budget_sweep import BLOCK_ATTRS as KIND_ATTRS
from .budget_sweep import MODELS, timed_forwards
from .budget_sweep import build as build_spec
from .budget_sweep import inputs_for as spec_inputs
from .dlo_stream import PRESETS, log, measure_bandwidth
from .fp8_profile import BlockEvents, copy_times, summarize, upcast_rate

FP8, BF16 = torch.float8_e4m3fn, torch.bfloat16
SPECS: dict[str, dict[str, Any]] = {"flux-dev": dict(kind="flux", cfg=PRESETS["flux-dev"], res=1024),
                                    "small": dict(kind="flux", cfg=PRESETS["small"], res=128),
                                    "wan14b": MODELS["wan"], "wan-small": MODELS["wan-small"]}
RUNS = ("resident_bf16", "layerwise", "upcast", "dlo_bf16", "dlo_fp8", "dlo_fp8_mod")
BLOCK_ATTRS: tuple[str, ...] = ()  # the preset's block lists (set in main)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(spec: dict[str, Any], device: torch.device) -> torch.nn.Module:
    """Random bf16 weights, deterministic (made on the device: fast)."""
    return build_spec(spec, device)




def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def resident(spec: dict[str, Any], inputs: dict[str, Any], iters: int, device: torch.device,
             prepare: Callable[[torch.nn.Module], None] | None = None) -> tuple[dict[str, Any], torch.Tensor]:
    model = build(spec, device)
    if prepare is not None:
        prepare(model)
    step, times, out = timed_forwards(model, inputs, device, iters)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    free(device)
    return {"step_s": step, "times": times, "device_weight_bytes": weights}, out


def streamed(spec: dict[str, Any], inputs: dict[str, Any], iters: int, device: torch.device, *,
             storage: torch.dtype | None, modulation: bool = False, slots: int = 2, profile: bool = False
             ) -> tuple[dict[str, Any], torch.Tensor]:
    """Every block streamed (`slots` = number of blocks: every block stays in the ring, so only the
    upcast remains of the streaming work)."""
    model = build(spec, device)
    rate = None
    if storage is not None:
        cast_for_storage(model, storage, modulation=modulation)  # on the device: fast
        for name, child in model.named_children():
            if name not in BLOCK_ATTRS:
                module_upcast(child, BF16)  # resident non-block layers: upcast once, as placement does
        if device.type == "cuda":
            rate = upcast_rate([b for a in BLOCK_ATTRS for b in getattr(model, a)], BF16)
    for a in BLOCK_ATTRS:
        getattr(model, a).to("cpu")
    free(device)
    before = pinned_bytes_held()
    t0 = time.perf_counter()
    blocks = [(a, list(getattr(model, a))) for a in BLOCK_ATTRS]
    n = sum(len(m) for _, m in blocks)
    bus = EventBus()
    events = BlockEvents([(f"{a}.{i}", m) for a, ms in blocks for i, m in enumerate(ms)]) if profile else None
    if events is not None:
        events.install_outer()  # before the streamer's hooks: `enter` precedes its wait and upcast
    streamer = LayerwiseStreamer(blocks, device, residency=BlockResidency.leading(n, 0, min(slots, n)),
                                 compute_dtype=BF16 if storage is not None else None, bus=bus)
    streamer.attach()
    attach_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step, times, out = timed_forwards(model, inputs, device, iters)
    stats = streamer.take_step_stats(wait=True)
    profiled = None
    if events is not None and device.type == "cuda":
        events.install_inner()  # after the streamer's hooks: `ready` follows its wait and upcast
        subscription = bus.subscribe(maxlen=100_000)
        events.recording = True
        forwards = 3
        timed_forwards(model, inputs, device, forwards, warmup=0)
        events.recording = False
        pstats = streamer.take_step_stats(wait=True)
        copies = copy_times(bus, subscription)
        per_block = events.per_block()
        for row in per_block:
            row["copy_ms"] = copies.get(row["block"], 0.0)
        events.remove()
        profiled = {"per_block": per_block, "per_step": summarize(per_block, step, pstats.stall_s / forwards)}
    result = {"storage": str(storage or BF16), "modulation": modulation, "slots": streamer.num_slots,
              "step_s": step, "times": times, "attach_s": attach_s, "streamed_bytes": streamer.streamed_bytes,
              "pinned_bytes": pinned_bytes_held() - before, "host_arena_bytes": streamer.host_bytes,
              "largest_block": streamer.largest_block_bytes,
              "stall_s_per_step": stats.stall_s / (iters + 2),
              "peak_allocated": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
              "upcast": rate, "profile": profiled}
    streamer.detach()
    del model, streamer
    free(device)
    return result, out


def _profile_line(r: dict[str, Any]) -> str:
    p = (r.get("profile") or {}).get("per_step")
    if not p:
        return ""
    return (f"; per step: copies {p['copy_s']:.4f} s, compute {p['compute_s']:.4f} s, upcast {p['upcast_s']:.4f} s, "
            f"exposed wait {p['stall_s']:.4f} s, link idle {p['link_idle_s']:.4f} s ({p['bound']}-bound)")


def main() -> None:
    global BLOCK_ATTRS
    parser = harness.parser(__doc__, out="fp8_stream.json", device="cuda", iters=3)
    parser.add_argument("--preset", choices=sorted(SPECS), default="flux-dev")
    parser.add_argument("--res", type=int, default=None, help="Flux presets: the square size (default: the preset's)")
    parser.add_argument("--runs", nargs="*", choices=RUNS, default=list(RUNS))
    parser.add_argument("--profile", action="store_true", help="per-block CUDA events for each DLO run")
    parser.add_argument("--slots", type=int, nargs="+", default=[2],
                        help="ring depths of the fp8 DLO runs, each measured (default: 2)")
    args = parser.parse_args()
    device = torch.device(args.device)
    spec = dict(SPECS[args.preset])
    if args.res is not None and spec["kind"] == "flux":
        spec["res"] = args.res
    BLOCK_ATTRS = KIND_ATTRS[spec["kind"]]
    runs = set(args.runs)
    import diffusers

    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                              "torch": torch.__version__, "diffusers": diffusers.__version__, "preset": args.preset,
                              "res": spec.get("res"), "iters": args.iters, "runs": sorted(runs),
                              "date": time.strftime("%Y-%m-%d")}
    inputs = spec_inputs(spec, device)
    if device.type == "cuda":
        report["bandwidth_gbps"] = measure_bandwidth()
        bw = report["bandwidth_gbps"]["pinned_arena"] * 1e9
        log(f"bandwidth {report['bandwidth_gbps']}")
    else:
        bw = float("inf")

    ref16 = ref8 = ref_mod = None
    if runs & {"resident_bf16", "dlo_bf16"}:
        report["resident_bf16"], ref16 = resident(spec, inputs, args.iters, device)
        log(f"resident bf16 {report['resident_bf16']['step_s']:.4f} s")
    if runs & {"layerwise", "upcast", "dlo_fp8"}:
        report["resident_layerwise_casting"], ref8 = resident(
            spec, inputs, args.iters, device,
            lambda m: m.enable_layerwise_casting(storage_dtype=FP8, compute_dtype=BF16))
        log(f"resident layerwise casting {report['resident_layerwise_casting']['step_s']:.4f} s")
    if "dlo_fp8_mod" in runs:
        _, ref_mod = resident(spec, inputs, 1, device, lambda m: apply_storage_hooks(m, FP8, BF16, modulation=True))

    n = sum(len(getattr(build_meta(spec), a)) for a in BLOCK_ATTRS)
    floors: dict[bool, float] = {}
    if "upcast" in runs:
        for modulation in (False, True) if "dlo_fp8_mod" in runs else (False,):
            upcast, out = streamed(spec, inputs, args.iters, device, storage=FP8, slots=n, modulation=modulation)
            ref = ref_mod if modulation else ref8
            upcast["identical_to_layerwise_casting"] = ref is not None and bool(torch.equal(out, ref))
            report["compute_with_upcast" + ("_modulation" if modulation else "")] = upcast
            floors[modulation] = upcast["step_s"]
            rate = upcast.get("upcast") or {}
            log(f"compute with upcast{' (modulation)' if modulation else ''} {upcast['step_s']:.4f} s, identical "
                f"{upcast['identical_to_layerwise_casting']}"
                + (f"; upcast alone {rate['seconds']:.4f} s for {rate['fp8_elements'] / 1e9:.2f} G fp8 elements = "
                   f"{rate['seconds_per_gb']:.4f} s/GB ({rate['elements_per_s']:.3e} elements/s)" if rate else ""))

    bf16 = None
    if "dlo_bf16" in runs:
        bf16, out = streamed(spec, inputs, args.iters, device, storage=None, profile=args.profile)
        bf16["identical_to_resident"] = bool(torch.equal(out, ref16))
        bf16["floor_s"] = max(report["resident_bf16"]["step_s"], bf16["streamed_bytes"] / bw)
        bf16["ratio_to_floor"] = bf16["step_s"] / bf16["floor_s"]
        report["dlo_bf16"] = bf16
        log(f"DLO bf16 {bf16['step_s']:.4f} s, floor {bf16['floor_s']:.4f}, ratio {bf16['ratio_to_floor']:.3f}"
            + _profile_line(bf16))

    report["dlo_fp8"] = []
    for modulation, ref, wanted, slots in ((m, r8, w, k) for m, r8, w in ((False, ref8, "dlo_fp8"),
                                                                       (True, ref_mod, "dlo_fp8_mod"))
                                            for k in args.slots):
        if wanted not in runs:
            continue
        r, out = streamed(spec, inputs, args.iters, device, storage=FP8, modulation=modulation, slots=slots,
                          profile=args.profile)
        r["identical_to_resident_cast_same_way"] = ref is not None and bool(torch.equal(out, ref))
        if ref16 is not None:
            r["max_abs_diff_vs_bf16"] = float((out.float() - ref16.float()).abs().max())
        compute = floors.get(modulation, floors.get(False))  # without the upcast run: the resident fp8 step
        if compute is None and "resident_layerwise_casting" in report:
            compute = report["resident_layerwise_casting"]["step_s"]
        r["floor_s"] = max(compute or 0.0, r["streamed_bytes"] / bw)
        r["ratio_to_floor"] = r["step_s"] / r["floor_s"] if r["floor_s"] > 0 else None
        if "resident_layerwise_casting" in report and not modulation:  # Wan's target: <= 1.03x resident fp8
            r["step_over_resident_fp8"] = r["step_s"] / report["resident_layerwise_casting"]["step_s"]
        if bf16 is not None:
            r["step_over_bf16_dlo"] = r["step_s"] / bf16["step_s"]
            r["pinned_over_bf16"] = r["pinned_bytes"] / max(1, bf16["pinned_bytes"])
            r["arena_over_bf16"] = r["host_arena_bytes"] / max(1, bf16["host_arena_bytes"])
        report["dlo_fp8"].append(r)
        extra = "".join(f", {label} {r[key]:.3f}x" for key, label in (
            ("step_over_resident_fp8", "resident fp8"), ("step_over_bf16_dlo", "bf16 DLO"),
            ("pinned_over_bf16", "pinned vs bf16")) if key in r)
        log(f"DLO fp8{' + modulation' if modulation else ''} (k={r['slots']}): {r['step_s']:.4f} s, "
            f"floor {r['floor_s']:.4f}, "
            f"ratio {r['ratio_to_floor'] or 0:.3f}{extra}, identical {r['identical_to_resident_cast_same_way']}"
            + _profile_line(r))
    harness.write(report, args)
    log(f"wrote {args.out}")


def build_meta(spec: dict[str, Any]) -> torch.nn.Module:
    """The model's structure only (block counts), on the meta device."""
    from diffusers import FluxTransformer2DModel, WanTransformer3DModel

    cls = FluxTransformer2DModel if spec["kind"] == "flux" else WanTransformer3DModel
    with torch.device("meta"):
        return cls(**spec["cfg"])


if __name__ == "__main__":
    main()
