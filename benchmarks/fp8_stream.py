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
DLO step of the same run. Usage:
  python -m benchmarks.fp8_stream --out fp8_stream.json [--preset flux-dev|small] [--device cuda|cpu]
(`--device cpu --preset small --res 128` is a smoke run of the script itself.)
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from omni_console.engine.stream_dtype import apply_storage_hooks, cast_for_storage
from omni_console.offload.pinned import pinned_bytes_held
from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer
from omni_console.offload.upcast import module_upcast

from . import harness
from .dlo_stream import BLOCK_ATTRS, PRESETS, log, measure_bandwidth

FP8, BF16 = torch.float8_e4m3fn, torch.bfloat16


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(cfg: dict[str, Any], device: torch.device, seed: int = 0) -> torch.nn.Module:
    """Random bf16 weights, deterministic from the seed (made on the device: fast)."""
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        model = FluxTransformer2DModel(**cfg)
    model = model.to(dtype=BF16).to_empty(device=device)
    gen = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=gen)
        for b in model.buffers():
            b.zero_()
    return model.requires_grad_(False).eval()


def inputs_for(cfg: dict[str, Any], res: int, device: torch.device) -> dict[str, Any]:
    g = torch.Generator(device).manual_seed(1)
    tokens, txt, side = (res // 16) ** 2, 512, res // 16
    kw = dict(device=device, dtype=BF16)
    ids = torch.zeros(tokens, 3, device=device)
    ids[:, 1] = torch.arange(side, device=device).repeat_interleave(side)
    ids[:, 2] = torch.arange(side, device=device).repeat(side)
    return dict(hidden_states=torch.randn(1, tokens, cfg["in_channels"], generator=g, **kw),
                encoder_hidden_states=torch.randn(1, txt, cfg["joint_attention_dim"], generator=g, **kw),
                pooled_projections=torch.randn(1, cfg["pooled_projection_dim"], generator=g, **kw),
                timestep=torch.tensor([0.5], **kw), guidance=torch.tensor([3.5], **kw),
                img_ids=ids, txt_ids=torch.zeros(txt, 3, device=device), return_dict=False)


def timed(model: torch.nn.Module, inputs: dict[str, Any], iters: int, device: torch.device,
          warmup: int = 2) -> tuple[float, list[float], torch.Tensor]:
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


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def resident(cfg: dict[str, Any], inputs: dict[str, Any], iters: int, device: torch.device,
             prepare: Callable[[torch.nn.Module], None] | None = None) -> tuple[dict[str, Any], torch.Tensor]:
    model = build(cfg, device)
    if prepare is not None:
        prepare(model)
    step, times, out = timed(model, inputs, iters, device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    free(device)
    return {"step_s": step, "times": times, "device_weight_bytes": weights}, out


def streamed(cfg: dict[str, Any], inputs: dict[str, Any], iters: int, device: torch.device, *,
             storage: torch.dtype | None, modulation: bool = False, slots: int = 2
             ) -> tuple[dict[str, Any], torch.Tensor]:
    """Every block streamed (`slots` = number of blocks: every block stays in the ring, so only the
    upcast remains of the streaming work)."""
    model = build(cfg, device)
    if storage is not None:
        cast_for_storage(model, storage, modulation=modulation)  # on the device: fast
        for name, child in model.named_children():
            if name not in BLOCK_ATTRS:
                module_upcast(child, BF16)  # resident non-block layers: upcast once, as placement does
    for a in BLOCK_ATTRS:
        getattr(model, a).to("cpu")
    free(device)
    before = pinned_bytes_held()
    t0 = time.perf_counter()
    blocks = [(a, list(getattr(model, a))) for a in BLOCK_ATTRS]
    n = sum(len(m) for _, m in blocks)
    streamer = LayerwiseStreamer(blocks, device, residency=BlockResidency.leading(n, 0, min(slots, n)),
                                 compute_dtype=BF16 if storage is not None else None)
    streamer.attach()
    attach_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step, times, out = timed(model, inputs, iters, device)
    stats = streamer.take_step_stats(wait=True)
    result = {"storage": str(storage or BF16), "modulation": modulation, "slots": streamer.num_slots,
              "step_s": step, "times": times, "attach_s": attach_s, "streamed_bytes": streamer.streamed_bytes,
              "pinned_bytes": pinned_bytes_held() - before, "host_arena_bytes": streamer.host_bytes,
              "largest_block": streamer.largest_block_bytes,
              "stall_s_per_step": stats.stall_s / (iters + 2),
              "peak_allocated": torch.cuda.max_memory_allocated() if device.type == "cuda" else None}
    streamer.detach()
    del model, streamer
    free(device)
    return result, out


def main() -> None:
    parser = harness.parser(__doc__, out="fp8_stream.json", device="cuda", iters=3)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="flux-dev")
    parser.add_argument("--res", type=int, default=1024)
    args = parser.parse_args()
    device = torch.device(args.device)
    cfg = PRESETS[args.preset]
    import diffusers

    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                              "torch": torch.__version__, "diffusers": diffusers.__version__, "preset": args.preset,
                              "res": args.res, "iters": args.iters, "date": time.strftime("%Y-%m-%d")}
    inputs = inputs_for(cfg, args.res, device)
    if device.type == "cuda":
        report["bandwidth_gbps"] = measure_bandwidth()
        bw = report["bandwidth_gbps"]["pinned_arena"] * 1e9
        log(f"bandwidth {report['bandwidth_gbps']}")
    else:
        bw = float("inf")

    report["resident_bf16"], ref16 = resident(cfg, inputs, args.iters, device)
    log(f"resident bf16 {report['resident_bf16']['step_s']:.4f} s")
    report["resident_layerwise_casting"], ref8 = resident(
        cfg, inputs, args.iters, device, lambda m: m.enable_layerwise_casting(storage_dtype=FP8, compute_dtype=BF16))
    log(f"resident layerwise casting {report['resident_layerwise_casting']['step_s']:.4f} s")
    _, ref_mod = resident(cfg, inputs, 1, device, lambda m: apply_storage_hooks(m, FP8, BF16, modulation=True))

    n = cfg["num_layers"] + cfg["num_single_layers"]
    upcast, out = streamed(cfg, inputs, args.iters, device, storage=FP8, slots=n)
    upcast["identical_to_layerwise_casting"] = bool(torch.equal(out, ref8))
    report["compute_with_upcast"] = upcast
    log(f"compute with upcast {upcast['step_s']:.4f} s, identical {upcast['identical_to_layerwise_casting']}")

    bf16, out = streamed(cfg, inputs, args.iters, device, storage=None)
    bf16["identical_to_resident"] = bool(torch.equal(out, ref16))
    bf16["floor_s"] = max(report["resident_bf16"]["step_s"], bf16["streamed_bytes"] / bw)
    bf16["ratio_to_floor"] = bf16["step_s"] / bf16["floor_s"]
    report["dlo_bf16"] = bf16
    log(f"DLO bf16 {bf16['step_s']:.4f} s, floor {bf16['floor_s']:.4f}, ratio {bf16['ratio_to_floor']:.3f}")

    report["dlo_fp8"] = []
    for modulation, ref in ((False, ref8), (True, ref_mod)):
        r, out = streamed(cfg, inputs, args.iters, device, storage=FP8, modulation=modulation)
        r["identical_to_resident_cast_same_way"] = bool(torch.equal(out, ref))
        r["max_abs_diff_vs_bf16"] = float((out.float() - ref16.float()).abs().max())
        r["floor_s"] = max(upcast["step_s"], r["streamed_bytes"] / bw)
        r["ratio_to_floor"] = r["step_s"] / r["floor_s"]
        r["step_over_bf16_dlo"] = r["step_s"] / bf16["step_s"]
        r["pinned_over_bf16"] = r["pinned_bytes"] / max(1, bf16["pinned_bytes"])
        r["arena_over_bf16"] = r["host_arena_bytes"] / max(1, bf16["host_arena_bytes"])
        report["dlo_fp8"].append(r)
        log(f"DLO fp8{' + modulation' if modulation else ''}: {r['step_s']:.4f} s, floor {r['floor_s']:.4f}, "
            f"ratio {r['ratio_to_floor']:.3f}, {r['step_over_bf16_dlo']:.3f}x bf16 DLO, pinned "
            f"{r['pinned_over_bf16']:.3f}x bf16, identical {r['identical_to_resident_cast_same_way']}")
    harness.write(report, args)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
