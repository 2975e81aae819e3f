"""DLO streaming vs the PCIe floor and vs diffusers group offload, side by side on one GPU.

A Flux-dev-size transformer (19 double + 38 single blocks, bf16, ~23.8 GB, random weights) runs one
forward at 1024² (one denoise step of the DiT) in four ways:
  resident                 all weights on the device (the compute floor)
  omni-console DLO         our LayerwiseStreamer: pinned exact-size arena, 2 slots, 1-block prefetch
  diffusers leaf_level     enable_group_offload(leaf_level, use_stream, record_stream) (diffusers' best)
  diffusers block_level    enable_group_offload(block_level, 1 block/group, use_stream, record_stream)
Floor for a streamed step = max(resident step, streamed bytes / measured pinned H2D bandwidth).
Also checked: DLO output == resident output (bit-identical), pinned bytes / streamed bytes, peak
allocated. Usage: python -m benchmarks.dlo_stream --out results.json [--preset flux-dev|small]
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import torch

from omni_console.offload.pinned import HostArena, pinned_bytes_held
from omni_console.offload.streamer import LayerwiseStreamer

from . import harness

PRESETS: dict[str, dict[str, Any]] = {
    "flux-dev": dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                     num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                     guidance_embeds=True, axes_dims_rope=(16, 56, 56)),
    "small": dict(patch_size=1, in_channels=64, num_layers=2, num_single_layers=4, attention_head_dim=64,
                  num_attention_heads=4, joint_attention_dim=512, pooled_projection_dim=128,
                  guidance_embeds=True, axes_dims_rope=(16, 24, 24)),
}
BLOCK_ATTRS = ("transformer_blocks", "single_transformer_blocks")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def measure_bandwidth(nbytes: int = 2**30, repeats: int = 5) -> dict[str, float]:
    """Pinned (our registered arena) and pageable host→device copy bandwidth, GB/s."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out: dict[str, float] = {}
    arena = HostArena(nbytes, pin=True)
    arena.tensor.fill_(1)
    pageable = torch.ones(nbytes, dtype=torch.uint8)
    for name, src, nb in (("pinned_arena", arena.tensor, True), ("pageable", pageable, False)):
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dev.copy_(src, non_blocking=nb)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out[name] = nbytes / min(times) / 1e9
    arena.close()
    del dev, pageable
    return out


def build_model(cfg: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    """Random bf16 weights made on the GPU (fast), deterministic from the seed."""
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        model = FluxTransformer2DModel(**cfg)
    model = model.to(dtype=torch.bfloat16).to_empty(device="cuda")
    gen = torch.Generator("cuda").manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=gen)
        for b in model.buffers():
            b.zero_()
    model.requires_grad_(False).eval()
    return model


def make_inputs(cfg: dict[str, Any], res: int) -> dict[str, torch.Tensor]:
    g = torch.Generator("cuda").manual_seed(1)
    tokens = (res // 16) ** 2
    txt = 512
    kw = dict(device="cuda", dtype=torch.bfloat16)
    ids = torch.zeros(tokens, 3, device="cuda")
    side = res // 16
    ids[:, 1] = torch.arange(side, device="cuda").repeat_interleave(side)
    ids[:, 2] = torch.arange(side, device="cuda").repeat(side)
    return dict(
        hidden_states=torch.randn(1, tokens, cfg["in_channels"], generator=g, **kw),
        encoder_hidden_states=torch.randn(1, txt, cfg["joint_attention_dim"], generator=g, **kw),
        pooled_projections=torch.randn(1, cfg["pooled_projection_dim"], generator=g, **kw),
        timestep=torch.tensor([0.5], **kw), guidance=torch.tensor([3.5], **kw),
        img_ids=ids, txt_ids=torch.zeros(txt, 3, device="cuda"), return_dict=False,
    )


def time_forward(model: torch.nn.Module, inputs: dict[str, Any], iters: int, warmup: int = 2
                 ) -> tuple[list[float], torch.Tensor]:
    with torch.no_grad():
        for _ in range(warmup):
            out = model(**inputs)[0]
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            out = model(**inputs)[0]
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    return times, out


def block_bytes(model: torch.nn.Module) -> tuple[int, int]:
    blocks = [b for a in BLOCK_ATTRS for b in getattr(model, a)]
    sizes = [sum(p.numel() * p.element_size() for p in b.parameters()) for b in blocks]
    return sum(sizes), max(sizes)


def run_dlo(model: torch.nn.Module, inputs: dict[str, Any], iters: int, resident_layers: int) -> dict[str, Any]:
    streamed_total, largest = block_bytes(model)
    pinned_before = pinned_bytes_held()
    t0 = time.perf_counter()
    streamer = LayerwiseStreamer([(a, list(getattr(model, a))) for a in BLOCK_ATTRS], "cuda",
                                 resident_layers=resident_layers)
    streamer.attach()
    attach_s = time.perf_counter() - t0
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    times, out = time_forward(model, inputs, iters)
    stats = streamer.take_step_stats()
    result = {
        "resident_layers": resident_layers, "attach_s": attach_s,
        "step_s": statistics.median(times), "times": times,
        "streamed_bytes": streamer.streamed_bytes, "pinned_bytes": pinned_bytes_held() - pinned_before,
        "host_arena_bytes": streamer.host_bytes, "pin_failure": streamer.pin_failure_reason,
        "pinned_over_streamed": (pinned_bytes_held() - pinned_before) / max(1, streamer.streamed_bytes),
        "peak_allocated": torch.cuda.max_memory_allocated(), "largest_block": largest,
        "all_blocks_bytes": streamed_total,
        "stall_s_per_step": stats.stall_s / (iters + 2), "h2d_bytes_total": stats.h2d_bytes,
    }
    streamer.detach()
    return result | {"output": out}


def run_diffusers(cfg: dict[str, Any], inputs: dict[str, Any], iters: int, offload_type: str) -> dict[str, Any]:
    model = build_model(cfg)
    model.to("cpu")
    gc.collect()
    torch.cuda.empty_cache()
    t0 = time.perf_counter()
    kwargs: dict[str, Any] = dict(onload_device=torch.device("cuda"), offload_device=torch.device("cpu"),
                                  offload_type=offload_type, use_stream=True, record_stream=True)
    if offload_type == "block_level":
        kwargs["num_blocks_per_group"] = 1
    model.enable_group_offload(**kwargs)
    setup_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    times, out = time_forward(model, inputs, iters)
    result = {"offload_type": offload_type, "setup_s": setup_s, "step_s": statistics.median(times), "times": times,
              "peak_allocated": torch.cuda.max_memory_allocated()}
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return result | {"output": out}


def main() -> None:
    parser = harness.parser(__doc__, out="dlo_stream.json", iters=5)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="flux-dev")
    parser.add_argument("--res", type=int, default=1024)
    parser.add_argument("--resident-layers", type=int, nargs="*", default=[0])
    parser.add_argument("--skip-diffusers", action="store_true")
    args = parser.parse_args()
    cfg = PRESETS[args.preset]
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "preset": args.preset, "res": args.res, "iters": args.iters,
                              "date": time.strftime("%Y-%m-%d")}
    import diffusers

    report["diffusers"] = diffusers.__version__
    log("bandwidth")
    report["bandwidth_gbps"] = measure_bandwidth()
    log(f"bandwidth {report['bandwidth_gbps']}")
    model = build_model(cfg)
    inputs = make_inputs(cfg, args.res)
    times, ref = time_forward(model, inputs, args.iters)
    total, largest = block_bytes(model)
    report["resident"] = {"step_s": statistics.median(times), "times": times,
                          "model_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                          "block_bytes": total, "largest_block": largest}
    log(f"resident {report['resident']['step_s']:.4f} s/step")
    bw = report["bandwidth_gbps"]["pinned_arena"] * 1e9
    report["dlo"] = []
    for layers in args.resident_layers:
        model = build_model(cfg)  # fresh weights: a streamer consumes its blocks
        for a in BLOCK_ATTRS:
            getattr(model, a).to("cpu")
        gc.collect()
        torch.cuda.empty_cache()
        r = run_dlo(model, inputs, args.iters, layers)
        out = r.pop("output")
        r["identical_to_resident"] = bool(torch.equal(out, ref))
        r["max_abs_diff"] = float((out.float() - ref.float()).abs().max())
        r["floor_s"] = max(report["resident"]["step_s"], r["streamed_bytes"] / bw)
        r["ratio_to_floor"] = r["step_s"] / r["floor_s"]
        r["effective_gbps"] = r["streamed_bytes"] / r["step_s"] / 1e9
        report["dlo"].append(r)
        log(f"DLO resident_layers={layers}: {r['step_s']:.4f} s/step, floor {r['floor_s']:.4f}, "
            f"ratio {r['ratio_to_floor']:.3f}, pinned/streamed {r['pinned_over_streamed']:.4f}, "
            f"identical {r['identical_to_resident']}, attach {r['attach_s']:.1f} s")
        del model
        gc.collect()
        torch.cuda.empty_cache()
    if not args.skip_diffusers:
        report["diffusers_group_offload"] = []
        floor = max(report["resident"]["step_s"], total / bw)
        for kind in ("leaf_level", "block_level"):
            r = run_diffusers(cfg, inputs, args.iters, kind)
            out = r.pop("output")
            r["max_abs_diff_vs_resident"] = float((out.float() - ref.float()).abs().max())
            r["ratio_to_floor"] = r["step_s"] / floor
            report["diffusers_group_offload"].append(r)
            log(f"diffusers {kind}: {r['step_s']:.4f} s/step, ratio {r['ratio_to_floor']:.3f}, "
                f"setup {r['setup_s']:.1f} s")
    harness.write(report, args)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
