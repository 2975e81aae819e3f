"""LoRA on a streamed DiT, in one run on one GPU (issue 38's speed targets).

A Flux-dev-size transformer (random bf16 weights, every block streamed through 2 slots) runs forwards at
1024² with a rank-64 LoRA on every linear of the transformer, applied as the engine applies it
(engine/loading/lora_apply.py: diffusers' `load_lora_weights`, then PEFT's forward for `sidecar`, or each
block merged into its slot as it arrives for `merge`):
  no LoRA               the step every ratio is against
  merge                 target <= 1.03x no LoRA
  sidecar               target <= 1.07x no LoRA
and the same three with fp8 storage (each block upcast to bf16 in its slot; merge lands after the upcast).
Then, on the bf16 model:
  switch                remove one LoRA and apply another (the engine's `set_loras` without the file check),
                        merge and sidecar: target <= 0.5 s
  host growth           process RSS after the LoRA is applied and a forward ran, minus before the LoRA's
                        tensors were made: target <= the LoRA's bytes
Each figure is printed with its ratio and its target. Usage:
  python -m benchmarks.lora_stream --out lora_stream.json [--preset flux-dev|small] [--res 1024] [--rank 64]
      [--device cuda|cpu] [--runs ...]
(`--device cpu --preset small --res 64 --rank 4 --iters 1` is a smoke run of the script itself;
`--device cpu --preset flux-deep --res 64 --runs bf16` times the switch at Flux-dev's 504 layers on a CPU.)
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import torch

from omni_console.engine.loading.lora_apply import AppliedLoras, apply_loras, remove_loras, switch_loras
from omni_console.engine.loading.lora_files import LoraFile
from omni_console.engine.loading.stream_dtype import cast_for_storage
from omni_console.offload import upcast_add
from omni_console.offload.events import EventBus
from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer
from omni_console.offload.upcast import module_upcast

from . import harness
from .budget_sweep import build, inputs_for, timed_forwards
from .dlo_stream import PRESETS, log

FP8, BF16 = torch.float8_e4m3fn, torch.bfloat16
BLOCK_ATTRS = ("transformer_blocks", "single_transformer_blocks")
RUNS = ("bf16", "fp8")
TARGETS = {"merge": 1.03, "sidecar": 1.07, "switch_s": 0.5}
LORA_PRESETS = {**PRESETS, "flux-deep": dict(PRESETS["small"], num_layers=19, num_single_layers=38,
                                              attention_head_dim=16, joint_attention_dim=256,
                                              pooled_projection_dim=64, axes_dims_rope=(4, 6, 6))}
"""`flux-deep`: Flux-dev's 19 + 38 blocks (504 linears) at narrow widths: a switch's cost on a CPU, which is
per layer (PEFT's layers injected or swapped), not per byte."""


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def make_lora(model: torch.nn.Module, rank: int, seed: int) -> dict[str, torch.Tensor]:
    """diffusers/PEFT keys for every linear of the transformer, bf16 on the host (as a file would be read)."""
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            fan_out, fan_in = module.out_features, module.in_features
            tensors[f"transformer.{name}.lora_A.weight"] = (torch.randn(rank, fan_in, generator=g) * 0.01).to(BF16)
            tensors[f"transformer.{name}.lora_B.weight"] = (torch.randn(fan_out, rank, generator=g) * 0.01).to(BF16)
    return tensors


def as_file(tensors: dict[str, torch.Tensor], name: str) -> LoraFile:
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return LoraFile(Path(name), 1.0, tensors, nbytes, ("transformer",))


class Streamed:
    """The transformer with every block streamed (2 slots), wrapped in a pipeline diffusers can load LoRAs into."""

    def __init__(self, spec: dict[str, Any], device: torch.device, storage: torch.dtype | None) -> None:
        from diffusers import FluxPipeline

        self.model = build(spec, device)
        if storage is not None:
            cast_for_storage(self.model, storage)
            for name, child in self.model.named_children():
                if name not in BLOCK_ATTRS:
                    module_upcast(child, BF16)  # the non-block layers: upcast once, as placement does
        for a in BLOCK_ATTRS:
            getattr(self.model, a).to("cpu")
        free(device)
        blocks = [(a, list(getattr(self.model, a))) for a in BLOCK_ATTRS]
        n = sum(len(m) for _, m in blocks)
        self.streamer = LayerwiseStreamer(blocks, device, residency=BlockResidency.leading(n, 0, 2),
                                          compute_dtype=BF16 if storage is not None else None, bus=EventBus())
        self.streamer.attach()
        self.pipe = FluxPipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, text_encoder_2=None,
                                 tokenizer_2=None, transformer=self.model)
        self.placement = SimpleNamespace(streamer=self.streamer, device=device, stagers={})
        self.applied = AppliedLoras()

    def apply(self, lora: LoraFile | None, mode: str) -> float:
        """Take off what is applied and apply `lora` (None: nothing) in `mode`, as the engine's `set_loras` does
        (hot-swapped where the LoRA has the layout of the one applied); the seconds it took."""
        loras = [lora] if lora else []
        return self._timed(lambda: switch_loras(self.pipe, self.placement, self.applied, loras, mode))

    def reload(self, lora: LoraFile, mode: str) -> float:
        """The same switch without a hot swap: diffusers' unload, then load; the seconds it took."""
        def unload_and_load() -> AppliedLoras:
            remove_loras(self.pipe, self.placement, self.applied)
            return apply_loras(self.pipe, self.placement, [lora], mode, self.applied)

        return self._timed(unload_and_load)

    def _timed(self, switch: Callable[[], AppliedLoras]) -> float:
        t0 = time.perf_counter()
        self.applied = switch()
        if self.placement.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def close(self) -> None:
        self.streamer.detach()
        del self.model, self.pipe, self.streamer


def run_storage(spec: dict[str, Any], inputs: dict[str, Any], args: Any, device: torch.device,
                storage: torch.dtype | None, lora: LoraFile, other: LoraFile) -> dict[str, Any]:
    label = "fp8" if storage is not None else "bf16"
    s = Streamed(spec, device, storage)
    out: dict[str, Any] = {}
    try:
        out["no_lora_step_s"], _, base = timed_forwards(s.model, inputs, device, args.iters)
        outputs = {}
        log(f"{label}: no LoRA {out['no_lora_step_s']:.4f} s")
        for mode in ("merge", "sidecar"):
            out[f"{mode}_apply_s"] = s.apply(lora, mode)
            step, _, outputs[mode] = timed_forwards(s.model, inputs, device, args.iters)
            out[f"{mode}_changes_output"] = not bool(torch.equal(outputs[mode], base))  # the LoRA really applied
            if mode == "merge":  # layers whose fp8 weight took its delta in the upcast's pass (offload/upcast_add)
                out["merge_fused_layers"] = s.applied.merge.fused_layers if s.applied.merge is not None else 0
                out["merge_fused_kernel"] = upcast_add.kernel_in_use()  # else the 2 steps
            else:  # layers on the forward without PEFT's multiply by 1.0
                out["sidecar_fast_layers"] = sum(type(m).__name__ == "FastLoraLinear" for m in s.model.modules())
            ratio = step / out["no_lora_step_s"]
            out[f"{mode}_step_s"], out[f"{mode}_ratio"] = step, ratio
            if storage is None:  # a switch to another LoRA between requests, no base weight read again
                out[f"{mode}_switch_s"] = s.apply(other, mode)  # the same layout: hot-swapped
                timed_forwards(s.model, inputs, device, 1, warmup=0)
                out[f"{mode}_reload_s"] = s.reload(lora, mode)  # the way without a hot swap, beside it
            log(f"{label}: {mode} {step:.4f} s = {ratio:.3f}x no LoRA (target <= {TARGETS[mode]}x)"
                + (f"; switch {out[f'{mode}_switch_s']:.3f} s (target <= {TARGETS['switch_s']} s; "
                   f"unload + load {out[f'{mode}_reload_s']:.3f} s)"
                   if storage is None else ""))
        merge, sidecar = (outputs[m].float() for m in ("merge", "sidecar"))
        out["merge_vs_sidecar_max_abs"] = float((merge - sidecar).abs().max())  # rounding apart, not a LoRA apart
        out["lora_effect_max_abs"] = float((sidecar - base.float()).abs().max())
        s.apply(None, "merge")
    finally:
        s.close()
        free(device)
    return out


def host_growth(spec: dict[str, Any], inputs: dict[str, Any], args: Any, device: torch.device) -> dict[str, Any]:
    """RSS after a LoRA is made, applied and a forward ran, minus RSS before its tensors existed."""
    s = Streamed(spec, device, None)
    try:
        timed_forwards(s.model, inputs, device, 1, warmup=1)
        gc.collect()
        before = psutil.Process().memory_info().rss
        lora = as_file(make_lora(s.model, args.rank, seed=7), "growth.safetensors")
        s.apply(lora, "merge")
        timed_forwards(s.model, inputs, device, 1, warmup=0)
        gc.collect()
        grown = psutil.Process().memory_info().rss - before
        result = {"rss_growth_bytes": grown, "lora_bytes": lora.nbytes, "ratio": grown / lora.nbytes}
        log(f"host growth {grown / 1e9:.3f} GB for a {lora.nbytes / 1e9:.3f} GB LoRA = {result['ratio']:.3f}x "
            "(target <= 1x)")
        s.apply(None, "merge")
        return result
    finally:
        s.close()
        free(device)


def main() -> None:
    parser = harness.parser(__doc__, out="lora_stream.json", device="cuda", iters=3)
    parser.add_argument("--preset", choices=sorted(LORA_PRESETS), default="flux-dev")
    parser.add_argument("--res", type=int, default=1024)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--runs", nargs="*", choices=RUNS, default=list(RUNS))
    args = parser.parse_args()
    device = torch.device(args.device)
    spec = dict(kind="flux", cfg=LORA_PRESETS[args.preset], res=args.res)
    import diffusers
    import peft

    diffusers.utils.logging.set_verbosity_error()  # one line per LoRA load saying no text-encoder keys: expected
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                              "torch": torch.__version__, "diffusers": diffusers.__version__, "peft": peft.__version__,
                              "preset": args.preset, "res": args.res, "rank": args.rank, "iters": args.iters,
                              "targets": TARGETS, "date": time.strftime("%Y-%m-%d")}
    inputs = inputs_for(spec, device)
    with torch.device("meta"):
        from diffusers import FluxTransformer2DModel

        shape = FluxTransformer2DModel(**spec["cfg"])
    lora = as_file(make_lora(shape, args.rank, seed=1), "a.safetensors")
    other = as_file(make_lora(shape, args.rank, seed=2), "b.safetensors")
    report["lora_bytes"] = lora.nbytes
    log(f"LoRA rank {args.rank} on every linear: {lora.nbytes / 1e9:.3f} GB ({len(lora.tensors) // 2} layers)")
    for run in args.runs:
        report[run] = run_storage(spec, inputs, args, device, FP8 if run == "fp8" else None, lora, other)
        harness.write(report, args)  # what a time box cuts off later is not lost
    del lora, other
    gc.collect()
    report["host"] = host_growth(spec, inputs, args, device)
    met = {f"{run}_{mode}": report[run][f"{mode}_ratio"] <= TARGETS[mode]
           for run in args.runs for mode in ("merge", "sidecar")}
    if "bf16" in args.runs:
        met.update({f"switch_{m}": report["bf16"][f"{m}_switch_s"] <= TARGETS["switch_s"]
                    for m in ("merge", "sidecar")})
    met["host_growth"] = report["host"]["ratio"] <= 1.0
    report["targets_met"] = met
    log("targets met: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in met.items()))
    harness.write(report, args)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
