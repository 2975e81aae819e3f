"""A Wan 2.2 A14B-size checkpoint with fp8-stored experts, as the community's fp8 checkpoints are (issue 35).

Two Wan-14B-size experts (`transformer` high-noise, `transformer_2` low-noise: 40 blocks of dim 5120, ffn 13824, as
Wan2.2-T2V-A14B) whose linear layers are saved as float8_e4m3fn safetensors (diffusers' layerwise-casting rule,
engine/loading/stream_dtype.py `storage_leaves`: norms, embeddings, `patch_embedding`, `proj_out`, the condition
embedder and `scale_shift_table` stay bf16; plain fp8, no scale tensors, which the engine refuses), 14.52 GB each;
the UMT5-XXL text encoder in bf16 (11.36 GB, its embedding stored once), the Wan VAE (0.51 GB, float32), UniPC with
flow shift 12 and `boundary_ratio` 0.875 (Wan2.2's t2v_A14B config: sample_shift 12.0, boundary 0.875). 40.9 GB in
all. Random weights (normal, std 0.02, made bf16 on the device and cast to fp8 there, one expert at a time: about
29 GB of device memory at the peak). The engine loads such a checkpoint as stored: no `--stream-dtype` (README).

    python -m benchmarks.wan22_checkpoint --dir /tmp/a14b-fp8                        # the A14B size, on a GPU
    python -m benchmarks.wan22_checkpoint --dir /tmp/a14b-tiny --tiny --device cpu   # 3-block experts, seconds
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path
from typing import Any

import torch

from .video_e2e import _random_on_cuda

BOUNDARY_RATIO = 0.875
FLOW_SHIFT = 12.0
EXPERT_14B: dict[str, Any] = dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128,
                                  in_channels=16, out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824,
                                  num_layers=40, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6)
EXPERT_TINY: dict[str, Any] = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16, in_channels=16,
                                   out_channels=16, text_dim=32, freq_dim=32, ffn_dim=128, num_layers=3,
                                   cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def store_in(module: torch.nn.Module, dtype: torch.dtype) -> int:
    """Re-type the layers diffusers' layerwise casting stores in `dtype` (fp8); the bytes now in `dtype`."""
    from omni_console.engine.loading.stream_dtype import storage_leaves

    nbytes = 0
    for _, leaf in storage_leaves(module):
        for p in leaf.parameters(recurse=False):
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)
                nbytes += p.numel() * p.element_size()
    return nbytes


def write_a14b_checkpoint(root: Path, *, fp8: str | None = "float8_e4m3fn", device: str = "cuda",
                          tiny: bool = False) -> dict[str, int]:
    """The checkpoint at `root` (see the module docstring); `fp8=None` keeps the experts bf16. Returns the bytes
    each expert stores in fp8."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from omni_console.engine.demo.demo_model import tiny_t5_config
    from omni_console.engine.demo.pipeline_save import save_pipeline
    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    size = EXPERT_TINY if tiny else EXPERT_14B
    storage = getattr(torch, fp8) if fp8 else None
    experts, in_fp8 = [], {}
    for name, seed in (("transformer", 1), ("transformer_2", 3)):  # one bf16 expert on the device at a time
        expert = _random_on_cuda(lambda: WanTransformer3DModel(**size), seed, device)
        in_fp8[name] = store_in(expert, storage) if storage is not None else 0
        experts.append(expert)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    tokenizer = build_t5_tokenizer()
    config = tiny_t5_config(len(tokenizer), umt5=True) if tiny else UMT5Config(
        vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
        feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False)
    encoder = _random_on_cuda(lambda: UMT5EncoderModel(config), 2, device)
    vae_config = dict(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                      temperal_downsample=[False, True, True]) if tiny else {}
    vae = AutoencoderKLWan(**vae_config).to(device, torch.float32).eval().requires_grad_(False)  # Wan2.1's VAE
    scheduler = UniPCMultistepScheduler(num_train_timesteps=1000, prediction_type="flow_prediction",
                                        use_flow_sigmas=True, flow_shift=FLOW_SHIFT, solver_order=2)
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=encoder, transformer=experts[0], vae=vae, scheduler=scheduler,
                       transformer_2=experts[1], boundary_ratio=BOUNDARY_RATIO)
    save_pipeline(pipe, root, class_names={"tokenizer": "T5TokenizerFast"})
    del pipe, experts, encoder, vae
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return in_fp8


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="3-block experts, tiny encoder and VAE (a CPU check)")
    p.add_argument("--fp8", default="float8_e4m3fn", help="the experts' storage dtype ('none': bf16)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    in_fp8 = write_a14b_checkpoint(args.dir, fp8=None if args.fp8 == "none" else args.fp8, device=args.device,
                                   tiny=args.tiny)
    total = sum(f.stat().st_size for f in args.dir.rglob("*") if f.is_file())
    print(f"wrote {args.dir} ({total / 1e9:.2f} GB, fp8 bytes per expert {in_fp8}) in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
