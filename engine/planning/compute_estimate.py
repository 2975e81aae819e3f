"""Per-block compute of a DiT forward before any profile exists: FLOPs from the config and request size,
divided by the device's bf16 throughput from a documented table.

FLOPs of one block at a request size (the batch, two where guidance is batched, multiplies them all):
- matrix products: 2 x parameters x the tokens that pass through them. A dual-stream joint block
  (Flux's `transformer_blocks`, SD3) has image and text weights of about the same size, each seeing
  its own tokens: parameters x (image + text tokens). A single-stream joint block: 2 x parameters x
  (image + text). A cross-attention block (Wan, PixArt, LTX): 2 x parameters x image tokens, except
  the cross-attention's key and value projections (2 d^2), which see the text tokens;
- attention: 4 x queries x keys x d (QK^T and AV), keys = the joint sequence, or for cross-attention
  the text tokens.

Seconds = FLOPs / (the table's dense bf16 peak x `EFFICIENCY`) + `BLOCK_OVERHEAD_S` (kernel launches,
norms, elementwise work that does not scale with FLOPs). Both constants are calibrated against the
GPU runs' recorded step times (Flux-size at 1024² and 512², Wan-14B-size at 81x480x832; held within
15 % by tests/engine/test_estimate_calibration.py). A device the table does not name, or a CPU,
gets no step time ("unknown"), never a guessed one. The host→device rate for the replay comes from
the same table by the GPU's PCIe generation (the console's probe or the streamer's own rate replaces
it as soon as one is measured).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from ..model_dir.discovery import ModelInfo
from .activation_estimate import JOINT_CLASSES, Geometry, PhaseEstimate, estimate_phases, geometry
from .plan import Plan, StreamedBlock
from .request_profile import RequestProfile, RequestSize

EFFICIENCY = 0.57  # achieved / peak dense bf16 on the recorded H200 runs (Flux 0.55, Wan 0.59)
BLOCK_OVERHEAD_S = 2e-4  # per block per forward: launches and memory-bound work (Flux-size at 512²)
GEN5, GEN4 = 55e9, 25e9  # pinned host→device bytes/s over PCIe x16 (Gen5: measured on the H200)
# (pattern on the device name, dense bf16 tensor TFLOP/s with fp32 accumulation, PCIe link rate);
# the first match wins, so more specific names come first
DEVICE_TABLE: tuple[tuple[str, float, float], ...] = (
    (r"\bB200\b", 2250.0, GEN5), (r"\bH200 NVL\b", 835.0, GEN5), (r"\bH200\b", 989.0, GEN5),
    (r"\bH100 PCIe\b", 756.0, GEN5), (r"\bH100 NVL\b", 835.0, GEN5), (r"\bH100\b", 989.0, GEN5),
    (r"\bH800\b", 989.0, GEN5), (r"\bH20\b", 148.0, GEN5), (r"\bA100\b", 312.0, GEN4), (r"\bA800\b", 312.0, GEN4),
    (r"\bL40S\b", 362.0, GEN4), (r"\bL40\b", 181.0, GEN4), (r"\bL4\b", 121.0, GEN4), (r"\bA10G\b", 70.0, GEN4),
    (r"\bA10\b", 125.0, GEN4), (r"\bA40\b", 150.0, GEN4), (r"RTX 6000 Ada", 364.0, GEN4),
    (r"\bRTX A6000\b", 155.0, GEN4), (r"RTX 5090", 210.0, GEN5), (r"RTX 4090", 165.0, GEN4),
    (r"RTX 4080", 97.0, GEN4), (r"RTX 3090", 71.0, GEN4),
)


def device_rates(device: str) -> tuple[float, float] | None:
    """(FLOP/s achieved in bf16, host→device bytes/s) for a device name; None: a CPU or not in the table."""
    if device == "cpu":
        return None
    for pattern, tflops, link in DEVICE_TABLE:
        if re.search(pattern, device):
            return tflops * 1e12 * EFFICIENCY, link
    return None


def peak_flops(device: str) -> float | None:
    """The device's dense bf16 peak in FLOP/s from the table (no efficiency applied: what no block can
    beat); None on a CPU or a device the table does not name."""
    rates = device_rates(device)
    return rates[0] / EFFICIENCY if rates is not None else None


def block_kind(class_name: str | None, attr: str) -> str:
    """"dual", "single" (joint attention) or "cross" (the image tokens only, text by cross-attention)."""
    if class_name not in JOINT_CLASSES:
        return "cross"
    if "single" in attr or class_name == "CogVideoXTransformer3DModel":  # CogVideoX: one set of weights
        return "single"
    return "dual"


def block_flops(kind: str, params: float, geo: Geometry) -> float:
    """FLOPs of one block, one forward (see the module docstring)."""
    n, t, d = geo.image_tokens, geo.text_tokens, geo.hidden
    if kind == "dual":
        s = n + t
        flops = params * s + 4.0 * s * s * d
    elif kind == "single":
        s = n + t
        flops = 2.0 * params * s + 4.0 * s * s * d
    else:
        kv = min(2.0 * d * d, params / 2)
        flops = 2.0 * (params - kv) * n + 2.0 * kv * t + 4.0 * n * n * d + 4.0 * n * t * d
    return geo.batch * flops


def forward_flops(model: ModelInfo, blocks: Sequence[StreamedBlock], size: RequestSize) -> list[float] | None:
    """FLOPs of each of `blocks` (one forward, execution order) at `size`; None when not estimable."""
    geo = geometry(model, size)
    if geo is None:
        return None
    out: list[float] = []
    for b in blocks:
        dit = next((c for c in model.denoisers if c.name == b.dit), None)
        lists = {bl.attr: bl for bl in dit.block_lists} if dit is not None else {}
        if dit is None or dit.role != "dit" or b.attr not in lists or not dit.nbytes:
            return None
        params = lists[b.attr].block_bytes[b.index] * dit.num_params / dit.nbytes
        out.append(block_flops(block_kind(dit.class_name, b.attr), params, geo))
    return out


def estimated_profile(plan: Plan, size: RequestSize, device: str,
                      phases: PhaseEstimate | None = None) -> RequestProfile | None:
    """A profile made of estimates (activations from configs; block compute and link rate on a device
    in the table, none on a CPU); None when the model is too small to say anything (no activations)."""
    model = plan.model
    phases = phases or estimate_phases(model, size)
    if phases.text_extra is None and phases.denoise_extra is None and phases.decode_extra is None:
        return None
    rates = device_rates(device)
    blocks = plan.forward[0]
    flops = forward_flops(model, blocks, size) if rates is not None else None
    compute = [f / rates[0] + BLOCK_OVERHEAD_S for f in flops] if flops is not None and rates else []
    geo = phases.geometry
    try:  # a config's numbers are input: an estimate beyond a profile's bounds is no estimate
        return RequestProfile(
            model=str(Path(model.path).resolve()), model_bytes=model.nbytes, device=device, size=size,
            block_compute_s=compute, other_s=0.0, forwards_per_step=geo.forwards_per_step if geo else 1,
            text_extra_bytes=phases.text_extra, denoise_extra_bytes=phases.denoise_extra,
            decode_extra_bytes=phases.decode_extra,
            bandwidth_bytes_per_s=rates[1] if rates and compute else None,
            measured_at=time.strftime("estimated %Y-%m-%dT%H:%M:%S"))
    except ValidationError:
        return None
