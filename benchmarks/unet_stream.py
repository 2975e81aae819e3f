"""SDXL-size UNet streamed unit by unit (or block by block) vs resident, against the PCIe floor, on one GPU.

An SDXL-base-size `UNet2DConditionModel` (2.57B parameters, bf16, random weights) runs one forward at
1024x1024 (a 128x128 latent; batch 2: one guided denoise step) in these ways:
  resident          all weights on the device (the compute floor)
  DLO, k slots      our LayerwiseStreamer over the UNet's units in execution order, as the engine plans
                    them (engine/model_dir/blocks.py `unet_block_lists`): grain `units` streams each down/mid/up
                    block's children in call order (SDXL: ~32 units, the largest ~0.7 GB); grain `blocks`
                    the 7 whole blocks (0.01 to 2.4 GB) as before. Every unit is streamed unless
                    --resident-layers says otherwise. Ring `slots`: k slots each the size of the
                    largest streamed unit (k-1 units ahead); ring `bytes` (what the engine plans for a
                    UNet): the same k x largest bytes as one buffer, the next units admitted in order
                    while they fit (offload/byte_ring.py), so many small units and the next big ones
                    are in flight at once
Per-unit compute (resident, CUDA events) is reported too: with the unit sizes it is what the step
forecast replays (engine/planning/step_forecast.py).
Floor for a streamed step = max(resident step, streamed bytes / measured pinned H2D bandwidth). A step
is timed three ways: each forward with the device synchronized after it (`step_s`: the next step's
copies, issued at this one's end, are waited for too, with nothing to overlap), with the compute stream
synchronized (`engine_step_s`, as engine/running/runner.py times a denoise step), and forwards back to back
(`loop_step_s`, a denoise loop without the engine's per-step timing; its floor uses the resident
model's back-to-back step).
Also checked: each DLO output == the resident output (bit-identical), peak allocated and the ring's
slot bytes (the largest unit sets the slot size: with SDXL's whole blocks two slots hold most of the UNet,
with its units about 1.4 GB).
Usage: python -m benchmarks.unet_stream --out unet_stream.json [--slots 2 3] [--resident-layers 0 1]
       [--grain units blocks] [--ring slots bytes]
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from omni_console.engine.loading.placement import block_modules
from omni_console.engine.model_dir.blocks import unet_block_lists
from omni_console.engine.model_dir.weights import TensorInfo
from omni_console.engine.planning.step_forecast import replay_forward
from omni_console.offload.block_timing import BlockTimer
from omni_console.offload.pinned import pinned_bytes_held
from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer

from . import harness
from .dlo_stream import log, measure_bandwidth, time_forward

SDXL_UNET: dict[str, Any] = dict(  # stabilityai/stable-diffusion-xl-base-1.0, unet/config.json
    act_fn="silu", addition_embed_type="text_time", addition_embed_type_num_heads=64, addition_time_embed_dim=256,
    attention_head_dim=[5, 10, 20], block_out_channels=[320, 640, 1280], cross_attention_dim=2048,
    down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"], in_channels=4,
    layers_per_block=2, norm_num_groups=32, out_channels=4, projection_class_embeddings_input_dim=2816,
    sample_size=128, transformer_layers_per_block=[1, 2, 10],
    up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"], use_linear_projection=True,
)
SMALL_UNET: dict[str, Any] = SDXL_UNET | dict(block_out_channels=[32, 64, 128], attention_head_dim=[2, 4, 8],
                                              transformer_layers_per_block=[1, 1, 2], cross_attention_dim=64,
                                              projection_class_embeddings_input_dim=6 * 256 + 64)
PRESETS = {"sdxl": SDXL_UNET, "small": SMALL_UNET}
BLOCK_ATTRS = ("down_blocks", "mid_block", "up_blocks")  # execution order


def build_unet(cfg: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    """Random bf16 weights made on the GPU (fast), deterministic from the seed."""
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        model = UNet2DConditionModel(**cfg)
    model = torch.nn.Module.to(model, torch.bfloat16).to_empty(device="cuda")  # plain cast: no fp32-modules warning
    gen = torch.Generator("cuda").manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=gen)
        for b in model.buffers():
            b.zero_()
    model.requires_grad_(False).eval()
    return model


def make_inputs(cfg: dict[str, Any], res: int, batch: int) -> dict[str, Any]:
    g = torch.Generator("cuda").manual_seed(1)
    kw = dict(device="cuda", dtype=torch.bfloat16)
    side = res // 8
    pooled = cfg["projection_class_embeddings_input_dim"] - 6 * cfg["addition_time_embed_dim"]
    return dict(
        sample=torch.randn(batch, cfg["in_channels"], side, side, generator=g, **kw),
        timestep=torch.tensor([500.0] * batch, device="cuda"),
        encoder_hidden_states=torch.randn(batch, 77, cfg["cross_attention_dim"], generator=g, **kw),
        added_cond_kwargs={"text_embeds": torch.randn(batch, pooled, generator=g, **kw),
                           "time_ids": torch.tensor([[res, res, 0, 0, res, res]] * batch, **kw)},
        return_dict=False,
    )


def unet_blocks(model: torch.nn.Module, cfg: dict[str, Any], grain: str) -> list[tuple[str, list[torch.nn.Module]]]:
    """The streamer's block lists: the engine's units (from the weights' names, as discovery finds them in a
    checkpoint) or the whole down/mid/up blocks."""
    if grain == "blocks":
        return [(a, block_modules(model, a)) for a in BLOCK_ATTRS]
    tensors = [TensorInfo(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), Path("unet"))
               for name, t in model.state_dict().items()]
    lists = unet_block_lists(Path("unet"), "UNet2DConditionModel", cfg, tensors)
    return [(b.attr, block_modules(model, b.attr, b.items)) for b in lists]


def block_sizes(model: torch.nn.Module, cfg: dict[str, Any], grain: str) -> list[int]:
    return [sum(p.numel() * p.element_size() for p in b.parameters())
            for _, bs in unet_blocks(model, cfg, grain) for b in bs]


def loop_step(model: torch.nn.Module, inputs: dict[str, Any], iters: int) -> float:
    """Seconds per forward of `iters` forwards back to back, as a denoise loop runs them (no synchronization
    between them: the next forward's first copies overlap this one's tail)."""
    with torch.no_grad():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            model(**inputs)
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def engine_step(model: torch.nn.Module, inputs: dict[str, Any], iters: int) -> float:
    """Median seconds per forward timed as engine/running/runner.py times a denoise step: the compute stream
    synchronized at both ends, the copy stream left running (the next step's first units on their way)."""
    times = []
    with torch.no_grad():
        for _ in range(iters):
            torch.cuda.current_stream().synchronize()
            t0 = time.perf_counter()
            model(**inputs)
            torch.cuda.current_stream().synchronize()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def unit_compute(model: torch.nn.Module, cfg: dict[str, Any], inputs: dict[str, Any], iters: int) -> list[float]:
    """Median seconds per forward of each unit (execution order), all resident."""
    timer = BlockTimer([b for _, bs in unet_blocks(model, cfg, "units") for b in bs], "cuda")
    time_forward(model, inputs, iters)
    seconds, _ = timer.take()
    timer.remove()
    return seconds


def run_dlo(cfg: dict[str, Any], inputs: dict[str, Any], iters: int, resident: int, slots: int,
            grain: str, ring: str) -> dict[str, Any]:
    model = build_unet(cfg)  # fresh weights: a streamer consumes its blocks
    for attr in BLOCK_ATTRS:
        getattr(model, attr).to("cpu")
    gc.collect()
    torch.cuda.empty_cache()
    lists = unet_blocks(model, cfg, grain)
    placed = BlockResidency.placed("leading", sum(len(bs) for _, bs in lists), resident, slots)
    residency = BlockResidency(placed.resident, placed.slots, placed.placement, byte_ring=ring == "bytes")
    pinned_before = pinned_bytes_held()
    t0 = time.perf_counter()
    streamer = LayerwiseStreamer(lists, "cuda", residency=residency)
    streamer.attach()
    attach_s = time.perf_counter() - t0
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    times, out = time_forward(model, inputs, iters)
    loop_s = loop_step(model, inputs, 2 * iters)
    engine_s = engine_step(model, inputs, iters)
    stats = streamer.take_step_stats()
    result = {
        "grain": grain, "ring": ring, "units": sum(len(bs) for _, bs in lists), "resident_layers": resident,
        "slots": streamer.num_slots, "slot_bytes": streamer.slot_bytes,
        "attach_s": attach_s, "step_s": statistics.median(times), "times": times, "loop_step_s": loop_s,
        "engine_step_s": engine_s,
        "streamed_bytes": streamer.streamed_bytes, "pinned_bytes": pinned_bytes_held() - pinned_before,
        "peak_allocated": torch.cuda.max_memory_allocated(), "largest_block": streamer.largest_block_bytes,
        "stall_s_per_step": stats.stall_s / (4 * iters + 2), "h2d_bytes_per_step": stats.h2d_bytes / (4 * iters + 2),
        "sync_fetches": stats.sync_fetches, "residency": residency,
    }
    streamer.detach()
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return result | {"output": out}


def main() -> None:
    parser = harness.parser(__doc__, out="unet_stream.json", iters=5)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="sdxl")
    parser.add_argument("--res", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2, help="2: one guided step (conditional + unconditional)")
    parser.add_argument("--resident-layers", type=int, nargs="*", default=[0])
    parser.add_argument("--slots", type=int, nargs="*", default=[2, 3])
    parser.add_argument("--grain", choices=("units", "blocks"), nargs="*", default=["units", "blocks"],
                        help="units: each block's children (the engine's plan); blocks: the 7 whole blocks")
    parser.add_argument("--ring", choices=("slots", "bytes"), nargs="*", default=["slots", "bytes"],
                        help="slots: k equal slots; bytes: their bytes as one buffer (the engine's plan for a UNet)")
    args = parser.parse_args()
    cfg = PRESETS[args.preset]
    import diffusers

    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "diffusers": diffusers.__version__, "preset": args.preset, "res": args.res,
                              "batch": args.batch, "iters": args.iters, "date": time.strftime("%Y-%m-%d")}
    log("bandwidth")
    report["bandwidth_gbps"] = measure_bandwidth()
    bw = report["bandwidth_gbps"]["pinned_arena"] * 1e9
    log(f"bandwidth {report['bandwidth_gbps']}")
    model = build_unet(cfg)
    inputs = make_inputs(cfg, args.res, args.batch)
    times, ref = time_forward(model, inputs, args.iters)
    resident_loop = loop_step(model, inputs, 2 * args.iters)
    grains = {g: block_sizes(model, cfg, g) for g in args.grain}
    report["resident"] = {"step_s": statistics.median(times), "times": times, "loop_step_s": resident_loop,
                          "params": sum(p.numel() for p in model.parameters()),
                          "model_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                          "unit_bytes": grains, "peak_allocated": torch.cuda.max_memory_allocated(),
                          "unit_compute_s": unit_compute(model, cfg, inputs, args.iters)}
    report["resident"]["other_s"] = report["resident"]["step_s"] - sum(report["resident"]["unit_compute_s"])
    log(f"resident {report['resident']['step_s']:.4f} s/step, {report['resident']['params'] / 1e9:.2f}B params; "
        f"unit compute ms {[round(c * 1e3, 2) for c in report['resident']['unit_compute_s']]}")
    for grain, sizes in grains.items():
        log(f"grain {grain}: {len(sizes)} units, largest {max(sizes):,} bytes ({max(sizes) / 1e9:.3f} GB), "
            f"two slots {2 * max(sizes) / 1e9:.2f} GB; units {[round(s / 1e9, 3) for s in sizes]} GB")
    del model
    gc.collect()
    torch.cuda.empty_cache()
    report["dlo"] = []
    runs = [(g, n, k, ring) for g in args.grain for ring in args.ring for n in args.resident_layers for k in args.slots]
    for grain, layers, slots, ring in runs:
        r = run_dlo(cfg, inputs, args.iters, layers, slots, grain, ring)
        out = r.pop("output")
        r["identical_to_resident"] = bool(torch.equal(out, ref))
        r["max_abs_diff"] = float((out.float() - ref.float()).abs().max())
        r["floor_s"] = max(report["resident"]["step_s"], r["streamed_bytes"] / bw)
        r["ratio_to_floor"] = r["step_s"] / r["floor_s"]
        r["loop_floor_s"] = max(resident_loop, r["streamed_bytes"] / bw)
        r["loop_ratio_to_floor"] = r["loop_step_s"] / r["loop_floor_s"]
        r["engine_ratio_to_floor"] = r["engine_step_s"] / r["floor_s"]
        if grain == "units":  # the plan's forecast: the streamer's schedule replayed over the resident unit times
            res = r.pop("residency")
            compute = report["resident"]["unit_compute_s"]
            other = max(resident_loop - sum(compute), 0.0)
            r["forecast_step_s"] = replay_forward(compute, grains["units"], res, bw, other).seconds
        else:
            r.pop("residency")
        report["dlo"].append(r)
        log(f"DLO {grain} ({r['units']} units, largest {r['largest_block']:,} bytes) resident_layers={layers} "
            f"ring={ring} slots={r['slots']}: step {r['step_s']:.4f} s, "
            f"floor {r['floor_s']:.4f} s = max(resident {report['resident']['step_s']:.4f}, "
            f"{r['streamed_bytes'] / 1e9:.2f} GB / "
            f"{bw / 1e9:.1f} GB/s), ratio {r['ratio_to_floor']:.3f}; compute-synced (as the engine times a step) "
            f"{r['engine_step_s']:.4f} s, ratio {r['engine_ratio_to_floor']:.3f}; "
            f"back to back {r['loop_step_s']:.4f} s, ratio {r['loop_ratio_to_floor']:.3f} "
            f"(floor {r['loop_floor_s']:.4f} s); identical {r['identical_to_resident']}, "
            f"peak {r['peak_allocated'] / 1e9:.2f} GB (slots {r['slot_bytes'] / 1e9:.2f} GB), "
            f"stall/step {r['stall_s_per_step']:.4f} s, sync fetches {r['sync_fetches']}"
            + (f"; forecast {r['forecast_step_s']:.4f} s" if "forecast_step_s" in r else ""))
    harness.write(report, args)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
