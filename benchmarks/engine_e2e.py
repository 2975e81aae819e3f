"""End to end on a Flux-size checkpoint: time to ready, step time and output vs plain diffusers.

Writes a FluxPipeline with Flux-dev-size random bf16 weights (transformer 23.8 GB in shards,
T5-XXL-size encoder 9.5 GB, CLIP-L, Flux VAE; offline tokenizers) to --dir, then:
  1. omni-console engine, DLO with every auxiliary staged: load (time to ready), generate;
  2. plain diffusers, everything resident on the GPU (the oracle): load, generate;
and reports load time, first request time, per-step times, staging bandwidth, pinned bytes,
peak allocated, and whether the two images are identical.
Usage: python -m benchmarks.engine_e2e --dir /tmp/flux-size --out e2e.json [--steps 4 --res 1024]
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omni_console.engine.engine import Engine
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.events import StagingEvent
from omni_console.offload.pinned import pinned_bytes_held
from omni_console.offload.policy import build_policy

from . import harness


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _random_(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator(next(module.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.02, generator=gen)
    return module.requires_grad_(False).eval()


def _on_device(factory, device: str = "cuda") -> torch.nn.Module:
    with torch.device("meta"):
        module = factory()
    return module.to(dtype=torch.bfloat16).to_empty(device=device)


def write_checkpoint(root: Path, device: str = "cuda", blocks: tuple[int, int] = (19, 38), t5_layers: int = 24) -> None:
    """Flux-dev-size components with random weights, saved as sharded safetensors. `blocks` (double, single) and
    `t5_layers` write a smaller checkpoint of the same widths (a CPU's load timing: `--blocks 2 4 --t5-layers 2`,
    4.0 GB), built on `device`."""
    from functools import partial

    _on = partial(_on_device, device=device)
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from omni_console.engine.demo.pipeline_save import save_pipeline
    from omni_console.engine.demo.tokenizers_offline import build_clip_tokenizer, build_t5_tokenizer

    transformer = _random_(_on(lambda: FluxTransformer2DModel(
        guidance_embeds=True, num_layers=blocks[0], num_single_layers=blocks[1])), 1)
    t5 = _random_(_on(lambda: T5EncoderModel(T5Config(
        vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=t5_layers, num_heads=64,
        feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False))), 2)
    clip = _random_(_on(lambda: CLIPTextModel(CLIPTextConfig(
        vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
        max_position_embeddings=77, projection_dim=768))), 3)
    vae = _random_(_on(lambda: AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=2, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
        use_post_quant_conv=False)), 4)
    for module in vae.modules():  # norms at identity keep a random VAE numerically tame
        if isinstance(module, torch.nn.GroupNorm):
            module.weight.data.fill_(1.0)
            module.bias.data.zero_()
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True),
                        vae=vae, text_encoder=clip, tokenizer=build_clip_tokenizer(),
                        text_encoder_2=t5, tokenizer_2=build_t5_tokenizer(), transformer=transformer)
    save_pipeline(pipe, root, shard_transformer=True)
    del pipe, transformer, t5, clip, vae
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def staging_rate(events: list[Any]) -> float | None:
    h2d = [e for e in events if isinstance(e, StagingEvent) and e.direction == "h2d" and not e.sync]
    secs = sum(e.seconds for e in h2d)
    return sum(e.nbytes for e in h2d) / secs / 1e9 if secs else None


def main() -> None:
    parser = harness.parser(__doc__, out="engine_e2e.json")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/flux-size"))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--res", type=int, default=1024)
    parser.add_argument("--write-only", action="store_true", help="only write the checkpoint (if missing)")
    parser.add_argument("--blocks", type=int, nargs=2, default=(19, 38), metavar=("DOUBLE", "SINGLE"),
                        help="the DiT's double and single blocks to write (default Flux-dev's 19 38)")
    parser.add_argument("--t5-layers", type=int, default=24, help="the T5 encoder's layers to write (default 24)")
    parser.add_argument("--write-device", default="cuda", help="where the random weights are made (cpu: no GPU)")
    args = parser.parse_args()
    if args.write_only:
        if not (args.dir / "model_index.json").exists():
            write_checkpoint(args.dir, args.write_device, tuple(args.blocks), args.t5_layers)
        return
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "date": time.strftime("%Y-%m-%d"), "steps": args.steps, "res": args.res}
    if not (args.dir / "model_index.json").exists():
        t0 = time.perf_counter()
        write_checkpoint(args.dir)
        report["write_s"] = time.perf_counter() - t0
        log(f"checkpoint written in {report['write_s']:.1f} s")
    request = GenerateRequest(prompt="a lighthouse on a cliff at dusk", steps=args.steps, height=args.res,
                              width=args.res, seed=5, guidance=3.5)

    engine = Engine(args.dir, device="cuda")
    report["model_bytes"] = engine.model.nbytes
    sub = engine.bus.subscribe()
    t0 = time.perf_counter()
    load = engine.load(build_policy({}, 0))
    load_s = time.perf_counter() - t0
    log(f"engine load {load_s:.1f} s, pinned {pinned_bytes_held() / 1e9:.2f} GB, streamed "
        f"{load.streamed_bytes / 1e9:.2f} GB")
    first = engine.generate(request)
    second = engine.generate(request)
    events = sub.drain()
    report["engine"] = {
        "load_s": load_s, "time_to_first_image_s": load_s + first.seconds,
        "first_request_s": first.seconds, "second_request_s": second.seconds,
        "steps_s": [s.wall_s for s in second.steps], "stall_s": [s.stall_s for s in second.steps],
        "pinned_bytes": load.pinned_bytes, "streamed_bytes": load.streamed_bytes,
        "pinned_over_streamed_plus_staged": load.pinned_bytes / (load.streamed_bytes + sum(
            s.staged_bytes for s in engine.placement.stagers.values())),
        "device_allocated_after_load": load.device_allocated_bytes, "peak_allocated": second.peak_allocated_bytes,
        "h2d_gbps": staging_rate(events), "dropped_events": sub.dropped,
    }
    log(f"engine: first request {first.seconds:.2f} s, steps {[round(s.wall_s, 3) for s in second.steps]}, "
        f"peak {second.peak_allocated_bytes / 1e9:.2f} GB")
    ours = np.asarray(second.image)
    engine.close()
    gc.collect()
    torch.cuda.empty_cache()

    from diffusers import FluxPipeline

    t0 = time.perf_counter()
    pipe = FluxPipeline.from_pretrained(args.dir, torch_dtype=torch.bfloat16, local_files_only=True).to("cuda")
    pipe.set_progress_bar_config(disable=True)
    plain_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    plain = np.asarray(pipe(**request.call_kwargs(pipe)).images[0])
    torch.cuda.synchronize()
    plain_req = time.perf_counter() - t0
    report["plain_diffusers_resident"] = {"load_s": plain_load, "request_s": plain_req}
    report["identical_to_plain_diffusers"] = bool(np.array_equal(ours, plain))
    report["max_abs_pixel_diff"] = int(np.abs(ours.astype(int) - plain.astype(int)).max())
    log(f"plain diffusers resident: load {plain_load:.1f} s, request {plain_req:.2f} s; identical "
        f"{report['identical_to_plain_diffusers']} (max pixel diff {report['max_abs_pixel_diff']})")
    harness.write(report, args)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
