"""Every VRAM budget at full speed: resident-layer sweeps, ring depth, placement and the auto-plan.

One DiT (Flux-dev-size at 1024², or Wan2.1-14B-size at 81x480x832; random bf16 weights) on one GPU:

1. resident run: per-block compute (offload.block_timing), the forward's other time, activation bytes
   above the weights (allocator peak - allocated before), the reference output;
2. link bandwidth, measured as the streamer copies (pinned, async, warmed, best of four);
3. leading placement (vLLM-Omni's `resident_layers`) at each --points value, every ring depth in
   --depths (the depth changes in place, `set_slots`): measured step, predicted step (the same
   replay the planner uses), floor = max(resident compute, streamed bytes / bandwidth);
4. spread placement at equal device bytes: the planner's best spread residency whose weights +
   slots fit in the leading point's (best depth);
5. auto-plan for each --budgets value (GB): the planner's choice (engine/stream_choice), run and
   measured: peak allocated vs budget, step vs forecast, and vs the best measured configuration of
   steps 3-4 whose measured peak fits the same budget.

Every streamed run's output is compared with the resident output (bit-identical expected).
A "step" here is one DiT forward (one denoise step without classifier-free guidance).

`--stream-dtype float8_e4m3fn`: the blocks are stored in fp8 by diffusers' layerwise-casting rule
(engine/loading/stream_dtype.py) and upcast on the device before each block runs; the resident reference is
diffusers' own `enable_layerwise_casting` hooks on the same layers (its per-block compute includes the
upcast, as the streamer's does), and the predicted peak counts the upcast scratch. With fp8 the
per-budget planner is the auto-planner's own search over resident blocks kept upcast too
(engine/planning/upcast_choice.py, `--upcast-resident auto`), run beside the same search with
`--upcast-resident off` (every resident block upcast per forward); `--upcast` also measures each leading
point again with every resident block kept upcast (converted once at attach), so the best fitting
measured configuration includes them.
Usage: python -m benchmarks.budget_sweep --model flux|wan|flux-small|wan-small --out sweep.json
       [--stream-dtype float8_e4m3fn --upcast --budgets 8 12 16 24]
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import torch

from omni_console.engine.device_probes import measure_h2d_bandwidth
from omni_console.engine.loading.stream_dtype import STREAM_DTYPES, apply_storage_hooks, cast_for_storage
from omni_console.engine.planning.stream_choice import TIE, choose_streaming, evaluate, profile_from_timings
from omni_console.engine.planning.stream_search import StreamTable
from omni_console.engine.planning.upcast_choice import UpcastChooser
from omni_console.engine.planning.upcast_cost import upcast_seconds
from omni_console.offload.block_timing import BlockTimer
from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer
from omni_console.offload.upcast import is_float8, module_upcast

from . import harness

GB = 1e9
MODELS: dict[str, dict[str, Any]] = {
    "flux": dict(kind="flux", cfg=dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38,
                                       attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                                       pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56)),
                 res=1024, points=[0, 10, 20, 28, 40, 50, 57]),
    "flux-small": dict(kind="flux", cfg=dict(patch_size=1, in_channels=64, num_layers=2, num_single_layers=4,
                                             attention_head_dim=32, num_attention_heads=2, joint_attention_dim=64,
                                             pooled_projection_dim=32, guidance_embeds=True,
                                             axes_dims_rope=(8, 12, 12)),
                       res=128, points=[0, 3, 6]),
    "wan": dict(kind="wan", cfg=dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128,
                                     in_channels=16, out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824,
                                     num_layers=40, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6),
                frames=81, height=480, width=832, points=[0, 10, 20, 30, 40]),
    "wan-small": dict(kind="wan", cfg=dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16,
                                           in_channels=4, out_channels=4, text_dim=32, freq_dim=16, ffn_dim=64,
                                           num_layers=4, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                           eps=1e-6),
                      frames=5, height=32, width=32, points=[0, 2, 4]),
}
BLOCK_ATTRS = {"flux": ("transformer_blocks", "single_transformer_blocks"), "wan": ("blocks",)}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync(device: torch.device) -> None:
    """The compute stream only, as the engine's step clock does: copies for the next forward run on."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def build(spec: dict[str, Any], device: torch.device) -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel, WanTransformer3DModel

    cls = FluxTransformer2DModel if spec["kind"] == "flux" else WanTransformer3DModel
    with torch.device("meta"):
        model = cls(**spec["cfg"])
    model = model.to(dtype=torch.bfloat16).to_empty(device=device)
    gen = torch.Generator(device.type).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=gen)
        for b in model.buffers():
            b.zero_()
    return model.requires_grad_(False).eval()


def inputs_for(spec: dict[str, Any], device: torch.device) -> dict[str, Any]:
    g = torch.Generator(device.type).manual_seed(1)
    kw: dict[str, Any] = dict(device=device, dtype=torch.bfloat16)
    cfg = spec["cfg"]
    if spec["kind"] == "flux":
        side = spec["res"] // 16
        ids = torch.zeros(side * side, 3, device=device)
        ids[:, 1] = torch.arange(side, device=device).repeat_interleave(side)
        ids[:, 2] = torch.arange(side, device=device).repeat(side)
        return dict(hidden_states=torch.randn(1, side * side, cfg["in_channels"], generator=g, **kw),
                    encoder_hidden_states=torch.randn(1, 512, cfg["joint_attention_dim"], generator=g, **kw),
                    pooled_projections=torch.randn(1, cfg["pooled_projection_dim"], generator=g, **kw),
                    timestep=torch.tensor([0.5], **kw), guidance=torch.tensor([3.5], **kw),
                    img_ids=ids, txt_ids=torch.zeros(512, 3, device=device), return_dict=False)
    frames = (spec["frames"] - 1) // 4 + 1
    return dict(hidden_states=torch.randn(1, cfg["in_channels"], frames, spec["height"] // 8, spec["width"] // 8,
                                          generator=g, **kw),
                timestep=torch.tensor([500], device=device),
                encoder_hidden_states=torch.randn(1, 512, cfg["text_dim"], generator=g, **kw), return_dict=False)


def blocks_of(model: torch.nn.Module, kind: str) -> list[tuple[str, list[torch.nn.Module]]]:
    return [(a, list(getattr(model, a))) for a in BLOCK_ATTRS[kind]]


def timed_forwards(model: torch.nn.Module, inputs: dict[str, Any], device: torch.device, iters: int,
                   warmup: int = 2) -> tuple[float, list[float], torch.Tensor]:
    """(median seconds, every forward's seconds, the last output) of `iters` synchronized forwards."""
    with torch.no_grad():
        for _ in range(warmup):
            out = model(**inputs)[0]
        sync(device)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            out = model(**inputs)[0]
            sync(device)
            times.append(time.perf_counter() - t0)
    return statistics.median(times), times, out


def time_forwards(model: torch.nn.Module, inputs: dict[str, Any], device: torch.device, iters: int,
                  warmup: int = 2) -> tuple[float, torch.Tensor]:
    step, _, out = timed_forwards(model, inputs, device, iters, warmup)
    return step, out


def peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


class Masters:
    """Host copies of every block's tensors, re-bound before each streamer so nothing is rebuilt."""

    def __init__(self, lists: list[tuple[str, list[torch.nn.Module]]]) -> None:
        self.lists = lists
        self.tensors = [[(t, t.detach().to("cpu")) for t in [*b.parameters(), *b.buffers()]]
                        for _, blocks in lists for b in blocks]

    def bind(self) -> None:
        for block in self.tensors:
            for t, master in block:
                t.data = master


def measured_run(model, inputs, device, lists, masters, residency, depths, iters, ref, profile, bw, fixed,
                 compute_dtype=None, predict=None):
    """Attach once, then time each ring depth in place; returns one row per depth. `predict(residency)`: the
    planner's StreamChoice for it (default: `evaluate` over `profile`; a chooser's for upcast blocks)."""
    masters.bind()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    t0 = time.perf_counter()
    streamer = LayerwiseStreamer(lists, device, residency=residency, compute_dtype=compute_dtype)
    streamer.attach()
    attach_s = time.perf_counter() - t0
    rows = []
    try:
        for k in depths:
            if residency.num_streamed == 0 and rows:
                break
            if residency.num_streamed:
                streamer.set_slots(k)
            r = streamer.residency
            peak_reset(device)
            step, out = time_forwards(model, inputs, device, iters)
            stats = streamer.take_step_stats(wait=True)
            predicted = predict(r) if predict is not None else evaluate(profile, r, bw, fixed)
            rows.append(dict(placement=r.placement, resident=r.num_resident, slots=r.slots, upcast=r.num_upcast,
                             resident_blocks=list(r.resident_indices), step_s=step,
                             predicted_step_s=predicted.step_s, forecast_error=predicted.step_s / step - 1,
                             floor_s=predicted.forward.floor_s,  # kept-upcast blocks: compute without their upcast
                             stall_s_per_forward=stats.stall_s / (iters + 2),
                             peak_allocated=peak(device), predicted_peak=predicted.peak_bytes,
                             peak_error=(predicted.peak_bytes / peak(device) - 1) if peak(device) else None,
                             identical=bool(torch.equal(out, ref)), attach_s=attach_s))
            rows[-1]["ratio_to_floor"] = step / rows[-1]["floor_s"]
            log(f"  {r.placement} resident={r.num_resident} upcast={r.num_upcast} k={r.slots}: {step:.4f} s "
                f"(pred {predicted.step_s:.4f},"
                f" floor {rows[-1]['floor_s']:.4f}, x{rows[-1]['ratio_to_floor']:.3f}) peak "
                f"{peak(device) / GB:.2f} GB (pred {predicted.peak_bytes / GB:.2f}) identical {rows[-1]['identical']}")
    finally:
        streamer.detach()
    return rows


def main() -> None:
    parser = harness.parser(__doc__, out="budget_sweep.json", device="cuda", iters=3)
    parser.add_argument("--model", choices=sorted(MODELS), default="flux")
    parser.add_argument("--points", type=int, nargs="*", default=None)
    parser.add_argument("--depths", type=int, nargs="*", default=[2, 4, 8, 16])
    parser.add_argument("--budgets", type=float, nargs="*", default=[8, 12, 16, 24, 32, 48])
    parser.add_argument("--stream-dtype", choices=sorted(STREAM_DTYPES), default=None)
    parser.add_argument("--upcast", action="store_true",
                        help="fp8: measure each leading point again with every resident block kept upcast")
    args = parser.parse_args()
    spec = MODELS[args.model]
    device = torch.device(args.device)
    import diffusers

    report: dict[str, Any] = {"model": args.model, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                              "diffusers": diffusers.__version__,
                              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    model = build(spec, device)
    inputs = inputs_for(spec, device)
    lists = blocks_of(model, spec["kind"])
    blocks = [b for _, bl in lists for b in bl]
    compute_dtype, scratch, elems = None, 0, [0] * len(blocks)
    if args.stream_dtype is not None:  # fp8 storage: the resident reference is diffusers' layerwise casting
        compute_dtype, storage = torch.bfloat16, STREAM_DTYPES[args.stream_dtype]
        cast_for_storage(model, storage)  # on the device: fast
        apply_storage_hooks(model, storage, compute_dtype)  # whole model: the rule sees qualified names
        elems = [sum(t.numel() for t in b.parameters() if is_float8(t.dtype)) for b in blocks]
        scratch = max(elems) * 2
        report["stream_dtype"], report["upcast_scratch_bytes"] = args.stream_dtype, scratch
    block_bytes = tuple(sum(t.numel() * t.element_size() for t in [*b.parameters(), *b.buffers()]) for b in blocks)
    sync(device)
    weights = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    peak_reset(device)
    resident_step, ref = time_forwards(model, inputs, device, args.iters)
    activation = peak(device) - weights
    timer = BlockTimer(blocks, device)
    with torch.no_grad():
        model(**inputs)
        sync(device)
        t0 = time.perf_counter()
        model(**inputs)
        sync(device)
        timed_forward = time.perf_counter() - t0
    compute, forwards = timer.take()
    timer.remove()
    if compute_dtype is not None:  # diffusers' hooks cannot be removed: the same weights again, for the streamer
        del model, timer
        gc.collect()
        model = build(spec, device)
        cast_for_storage(model, STREAM_DTYPES[args.stream_dtype])
        attrs = set(BLOCK_ATTRS[spec["kind"]])
        for name, child in model.named_children():
            if name not in attrs:
                module_upcast(child, compute_dtype)  # non-block layers: upcast once, as placement does
        lists = blocks_of(model, spec["kind"])
        blocks = [b for _, bl in lists for b in bl]
    raw_compute = sum(compute)
    non_block = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]) - sum(block_bytes)
    profile = profile_from_timings(block_bytes, compute, resident_step, 1, activation)
    other = profile.other_s
    fixed = non_block + scratch  # with fp8 storage the running block's upcast scratch is device memory too
    report["resident"] = dict(step_s=resident_step, timed_forward_s=timed_forward, block_compute_s=raw_compute,
                              other_s=other, activation_bytes=activation, weights_bytes=weights,
                              block_bytes=list(block_bytes), non_block_bytes=non_block, peak_allocated=peak(device))
    log(f"resident {resident_step:.4f} s/forward; blocks {raw_compute:.4f} s (timed), other {other:.4f} s; "
        f"activations {activation / GB:.2f} GB; weights {weights / GB:.2f} GB")
    for _, bl in lists:
        for b in bl:
            b.to("cpu")
    masters = Masters(lists)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    bw = measure_h2d_bandwidth(device) or 10 * GB
    report["bandwidth_gbps"] = bw / GB
    log(f"bandwidth {bw / GB:.1f} GB/s")
    n = len(blocks)
    rows: list[dict[str, Any]] = []
    for point in args.points or spec["points"]:
        log(f"leading resident_layers={point}")
        lead = measured_run(model, inputs, device, lists, masters, BlockResidency.leading(n, point, 2),
                            args.depths, args.iters, ref, profile, bw, fixed, compute_dtype)
        rows += lead
        if 0 < point < n:
            best = min(lead, key=lambda r: r["step_s"])
            r_best = BlockResidency.leading(n, point, best["slots"])
            weight_budget = sum(block_bytes[:point]) + r_best.slots * max(block_bytes[point:])
            choice, _ = choose_streaming(profile, bw, fixed, fixed + weight_budget + activation, ("spread",))
            if choice is not None and choice.residency.placement == "spread":
                log(f"spread at <= {weight_budget / GB:.2f} GB of block weights")
                spread = measured_run(model, inputs, device, lists, masters, choice.residency,
                                      [choice.residency.slots], args.iters, ref, profile, bw, fixed, compute_dtype)
                for r in spread:
                    r["equal_bytes_as_leading"] = point
                rows += spread
    table = StreamTable(profile, bw)
    choosers = {}  # fp8: the auto-planner's search with upcast "auto" and "off" (engine/planning/upcast_choice.py)
    if compute_dtype is not None:
        up = upcast_seconds(elems, "cuda" if device.type == "cuda" else "cpu")
        choosers = {"auto": UpcastChooser(table, up, elems), "off": UpcastChooser(table, [0.0] * n, elems)}

    def predict_with(chooser):
        return lambda r: chooser.evaluate(_pick_of(chooser, r), fixed)

    if args.upcast and compute_dtype is not None:
        for point in [p for p in (args.points or spec["points"]) if p]:
            lead = [r for r in rows if r["placement"] == "leading" and r["resident"] == point]
            k = min(lead, key=lambda r: r["step_s"])["slots"] if lead and point < n else 2
            residency = BlockResidency.leading(n, point, k).with_upcast(point)
            log(f"leading resident_layers={point}, every one kept upcast")
            rows += measured_run(model, inputs, device, lists, masters, residency, [residency.slots], args.iters,
                                 ref, profile, bw, fixed, compute_dtype, predict_with(choosers["auto"]))
    report["sweep"] = rows
    plans: list[dict[str, Any]] = []
    report["auto_plan"] = plans
    harness.write(report, args)  # written again after every planned run: a time-boxed run keeps what it measured
    for budget_gb in args.budgets:
        budget = int(budget_gb * GB)
        for mode, chooser in (choosers or {None: None}).items():
            choice, smallest = choose_streaming(profile, bw, fixed, budget, table=table)
            predict = None
            if chooser is not None and choice is not None:  # the planner's pick: candidate and upcast count
                pick = chooser.choose(budget - fixed - activation, TIE, "streamed")
                choice = None if pick is None else chooser.evaluate(pick, fixed)
                predict = predict_with(chooser)
            if choice is None:
                plans.append(dict(budget_gb=budget_gb, upcast_resident=mode, fits=False,
                                  smallest_peak=smallest.peak_bytes))
                log(f"budget {budget_gb} GB: nothing fits (smallest peak {smallest.peak_bytes / GB:.2f} GB)")
                continue
            r = choice.residency
            log(f"budget {budget_gb} GB{f' (upcast {mode})' if mode else ''}: {r.placement} resident={r.num_resident} "
                f"upcast={r.num_upcast} k={r.slots}")
            row = measured_run(model, inputs, device, lists, masters, r, [r.slots], args.iters, ref, profile, bw,
                               fixed, compute_dtype, predict)[0]
            fitting = [x for x in rows if (x["peak_allocated"] or x["predicted_peak"]) <= budget]
            best_measured = min((x["step_s"] for x in fitting), default=None)
            row.update(budget_gb=budget_gb, upcast_resident=mode, fits=True,
                       within_budget=row["peak_allocated"] <= budget, best_measured_step_s=best_measured,
                       vs_best_measured=(row["step_s"] / best_measured) if best_measured else None)
            plans.append(row)
            harness.write(report, args)
    harness.write(report, args)
    log(f"wrote {args.out}")


def _pick_of(chooser: UpcastChooser, residency: BlockResidency):
    """The chooser's pick for a residency measured here (its candidate in the table, its upcast count)."""
    from omni_console.engine.planning.upcast_choice import Pick

    t = chooser.table
    for index in range(len(t.resident)):
        r = t.residency(index)
        if (r.resident, r.slots, r.placement) == (residency.resident, residency.slots, residency.placement):
            return Pick(index, residency.num_upcast)
    raise ValueError("a residency the planner's table does not hold")


if __name__ == "__main__":
    main()
