"""Wan2.1-14B-size video through `omni-console run` to .mp4: DLO (everything streamed) vs resident.

Writes a WanPipeline with Wan2.1-T2V-14B-size random bf16 weights (transformer 40 blocks of dim
5120, UMT5-XXL-size encoder, the Wan VAE; offline tokenizer) to --dir once, then runs the real CLI
twice — `--mode dlo` with every DiT block streamed and `--mode resident` — at 81 frames of
480x832, and reports per-step times (steady = after the first step), their ratio, the request's
phases (text encoding, denoise, VAE decode) with the VAE decode peak, and the mp4's frame count.

    python -m benchmarks.video_e2e --dir /tmp/wan-size --out video_e2e.json [--steps 4]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from . import harness


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _random_on_cuda(factory, seed: int, device: str = "cuda") -> torch.nn.Module:
    with torch.device("meta"):
        module = factory()
    module = module.to(dtype=torch.bfloat16).to_empty(device=device)
    if hasattr(module, "tie_weights"):  # to_empty unties UMT5's embedding; the real UMT5-XXL stores it once
        module.tie_weights()
    gen = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.02, generator=gen)
        for m in module.modules():  # norms at identity keep random weights numerically tame
            if isinstance(m, (torch.nn.LayerNorm, torch.nn.GroupNorm)) and m.weight is not None:
                m.weight.fill_(1.0)
                if m.bias is not None:
                    m.bias.zero_()
    return module.requires_grad_(False).eval()


def write_checkpoint(root: Path) -> None:
    """Wan2.1-T2V-14B-size components with random bf16 weights, saved as safetensors."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from omni_console.engine.demo.pipeline_save import save_pipeline
    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    transformer = _random_on_cuda(lambda: WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6), 1)
    encoder = _random_on_cuda(lambda: UMT5EncoderModel(UMT5Config(
        vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
        feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False)), 2)
    vae = AutoencoderKLWan().to("cuda", torch.float32).eval().requires_grad_(False)  # the real Wan VAE shape
    pipe = WanPipeline(tokenizer=build_t5_tokenizer(), text_encoder=encoder, transformer=transformer, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0))
    save_pipeline(pipe, root, class_names={"tokenizer": "T5TokenizerFast"})
    del pipe, transformer, encoder, vae
    gc.collect()
    torch.cuda.empty_cache()


def run_cli(model: Path, out_dir: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    output = out_dir / f"wan-{mode}.mp4"
    cmd = [sys.executable, "-m", "omni_console.console.cli", "run", "--model", str(model), "--mode", mode,
           "--device", "cuda", "--prompt", "a red fox running through snow", "--steps", str(args.steps),
           "--frames", str(args.frames), "--height", str(args.height), "--width", str(args.width),
           "--guidance", "1.0", "--seed", "3", "--output", str(output), "--overwrite", "--json"]
    log(" ".join(cmd[2:]))
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        log(f"{mode} failed ({done.returncode}): {done.stderr[-2000:]}")
        return {"returncode": done.returncode, "stderr": done.stderr[-2000:]}
    report = json.loads(done.stdout)
    steps = [s["wall_s"] for s in report.get("steps", [])]
    import av

    with av.open(str(output)) as container:
        frames = sum(1 for _ in container.decode(video=0))
    summary = {"process_wall_s": wall, "load_s": report.get("load_seconds"), "steps_s": steps,
               "steady_step_s": statistics.median(steps[1:]) if len(steps) > 1 else (steps[0] if steps else None),
               "request_s": report.get("request_seconds"), "peak_allocated": report.get("peak_allocated_bytes"),
               "mp4_frames": frames, "report": report}
    log(f"{mode}: load {summary['load_s']:.1f} s, steps {[round(s, 3) for s in steps]}, mp4 frames {frames}")
    return summary


def main() -> None:
    parser = harness.parser(__doc__, out="video_e2e.json")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/wan-size"))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    args = parser.parse_args()
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "date": time.strftime("%Y-%m-%d"), "args": {k: str(v) for k, v in vars(args).items()}}
    if not (args.dir / "model_index.json").exists():
        t0 = time.perf_counter()
        write_checkpoint(args.dir)
        report["write_s"] = time.perf_counter() - t0
        log(f"checkpoint written in {report['write_s']:.1f} s")
    out_dir = Path(args.out).resolve().parent
    for mode in ("dlo", "resident"):
        report[mode] = run_cli(args.dir, out_dir, mode, args)
    dlo, resident = report["dlo"].get("steady_step_s"), report["resident"].get("steady_step_s")
    if dlo and resident:
        report["dlo_over_resident"] = dlo / resident
        log(f"steady step: DLO {dlo:.3f} s, resident {resident:.3f} s, ratio {dlo / resident:.4f}")
    harness.write(report, args)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
