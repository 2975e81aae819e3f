"""What `--lora` costs a plan: device bytes, and the extra work per denoising step of each mode.

Both modes keep every LoRA's A/B on the device in the compute dtype (PEFT moves them beside the base weight
and casts them to its dtype; merge needs them there to form B·A on the device). Merge also needs one scratch
the size of the largest targeted weight (PEFT's `get_delta_weight` forms B·A whole before adding it).

The extra work per step, in FLOPs, with the planner's compute estimate (compute_estimate.py) turning FLOPs
into seconds on a device it knows:
- sidecar: each LoRA linear of the denoiser runs x·Aᵀ·Bᵀ in every forward: 2·tokens·rank·(in + out), with
  the tokens that pass through that linear (the image tokens; the text tokens for a joint block's context
  stream and for cross-attention keys/values; both for a single-stream joint block), times the batch;
- merge: each LoRA linear in a *streamed* block forms B·A (2·rank·in·out) and adds it, each time the block
  arrives (once per forward); resident ones are merged once at load and cost nothing per step (with two
  experts, the running expert's: a switch merges the other's resident blocks once as it copies them, twice a
  request, which is not counted per step).
So the sidecar grows with the tokens and the merge with the streamed weights: at small sizes the sidecar is
cheaper, at large ones the merge. `auto` picks the mode whose forecast step is smaller (equal FLOP rates: the
fewer FLOPs). Both are FLOP estimates that ignore the memory traffic of the add and kernel launches.
Text-encoder LoRA layers run once per request, not per step, and are not counted here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..model_dir.discovery import ModelInfo
from .activation_estimate import JOINT_CLASSES, Geometry, geometry
from .compute_estimate import block_kind, device_rates
from .plan import Plan, compute_itemsize
from .request_profile import RequestSize

_TEXT_STREAM = ("context", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "txt_")  # a joint block's text side
_CROSS_KV = ("attn2.to_k", "attn2.to_v", "attn2.add_k_proj", "attn2.add_v_proj")  # keys/values from the text


@dataclass(frozen=True, slots=True)
class LoraModule:
    """One LoRA layer as diffusers applies it: the component, the module inside it, and A/B's shapes."""

    component: str
    module: str
    rank: int
    fan_in: int  # A's columns (in·kh·kw for a conv)
    fan_out: int  # B's rows

    @property
    def ab_elements(self) -> int:
        return self.rank * (self.fan_in + self.fan_out)

    @property
    def weight_elements(self) -> int:
        return self.fan_in * self.fan_out


@dataclass(frozen=True, slots=True)
class LoraModes:
    """A plan's LoRA figures: device bytes of each mode and the extra FLOPs / seconds per step of each."""

    ab_bytes: int  # every LoRA's A/B on the device, in the compute dtype (both modes)
    merge_scratch_bytes: int  # merge: one B·A of the largest targeted weight
    sidecar_flops: float | None  # per step; None: the request's tokens are not known (no geometry)
    merge_flops: float
    sidecar_s: float | None  # per step on the device; None: a device the compute table does not know
    merge_s: float | None
    chosen: str  # the mode `auto` resolves to (or the one asked for)
    why: str  # one line: why that mode

    def device_bytes(self, mode: str) -> int:
        return self.ab_bytes + (self.merge_scratch_bytes if mode == "merge" else 0)


def component_itemsizes(model: ModelInfo) -> dict[str, int]:
    """Each component's compute dtype width (bytes per element), from its files' dtypes."""
    return {c.name: compute_itemsize(c.dtypes) for c in model.components}


def ab_bytes(model: ModelInfo, modules: Sequence[LoraModule]) -> int:
    widths = component_itemsizes(model)
    return sum(m.ab_elements * widths.get(m.component, 2) for m in modules)


def merge_scratch_bytes(model: ModelInfo, modules: Sequence[LoraModule]) -> int:
    widths = component_itemsizes(model)
    return max((m.weight_elements * widths.get(m.component, 2) for m in modules), default=0)


def module_tokens(class_name: str | None, module: str, geo: Geometry) -> int:
    """Tokens one forward passes through a denoiser linear (see the module docstring)."""
    attr = module.split(".", 1)[0]
    if any(s in module for s in _CROSS_KV):
        return geo.text_tokens
    if class_name in JOINT_CLASSES:
        if block_kind(class_name, attr) == "single":
            return geo.image_tokens + geo.text_tokens
        if any(s in module for s in _TEXT_STREAM):
            return geo.text_tokens
    return geo.image_tokens


def _streamed_prefixes(plan: Plan) -> set[tuple[str, str]]:
    """(component, "attr.index.") of each block streamed in one forward."""
    blocks = plan.forward[0]
    return {(b.dit, f"{b.attr}.{b.index}.") for b in blocks if b.streamed}


def _in_streamed(module: LoraModule, streamed: set[tuple[str, str]]) -> bool:
    return any(c == module.component and module.module.startswith(p) for c, p in streamed)


def step_flops(plan: Plan, modules: Sequence[LoraModule], size: RequestSize) -> tuple[float | None, float]:
    """(sidecar, merge) extra FLOPs per denoising step; sidecar None when the tokens are not known."""
    model = plan.model
    denoisers = {d.name: d for d in model.denoisers}
    geo = geometry(model, size)
    forwards = geo.forwards_per_step if geo is not None else 1
    # with two experts only one runs per forward: count the running one's share (Wan 2.2's are the same size)
    running = {b.dit for b in plan.forward[0]} or set(denoisers)
    own = [m for m in modules if m.component in denoisers and m.component in running]
    streamed = _streamed_prefixes(plan)
    merge = sum(2.0 * m.rank * m.weight_elements for m in own if _in_streamed(m, streamed)) * forwards
    if geo is None:
        return None, merge
    sidecar = 0.0
    for m in own:
        tokens = module_tokens(denoisers[m.component].class_name, m.module, geo)
        sidecar += 2.0 * tokens * m.rank * (m.fan_in + m.fan_out)
    return sidecar * geo.batch * forwards, merge


def merges_into_fp8(plan: Plan) -> bool:
    """Whether merging under `plan` would write into fp8 storage: a resident block stored in fp8 and upcast per
    forward (not kept upcast) holds only its fp8 bytes between forwards (the peers' corruption)."""
    if plan.policy.stream_dtype is None:
        return False
    residency = plan.residency
    return any(r and not u for r, u in zip(residency.resident, residency.upcast_flags, strict=True))


def lora_modes(plan: Plan, modules: Sequence[LoraModule], size: RequestSize, device: str,
               mode: str) -> LoraModes:
    """The plan's LoRA figures at `size` on `device`, and the mode `mode` ("auto" decided here) resolves to."""
    sidecar, merge = step_flops(plan, modules, size)
    rates = device_rates(device)
    sidecar_s = sidecar / rates[0] if rates is not None and sidecar is not None else None
    merge_s = merge / rates[0] if rates is not None else None
    if mode != "auto":
        chosen, why = mode, f"{mode}, as asked"
    elif merges_into_fp8(plan):
        chosen, why = "sidecar", "auto: sidecar (fp8 resident blocks upcast per forward cannot be merged into)"
    elif sidecar is None:
        chosen, why = "merge", "auto: merge (the request's tokens are not known, so the sidecar's cost is not)"
    else:
        chosen = "sidecar" if sidecar < merge else "merge"
        why = f"auto: {chosen}, the smaller forecast step"
    return LoraModes(ab_bytes(plan.model, modules), merge_scratch_bytes(plan.model, modules), sidecar, merge,
                     sidecar_s, merge_s, chosen, why)


def with_lora(plan: Plan, device_bytes: int) -> Plan:
    """`plan` with the LoRA's device bytes counted among the resident ones (every peak, the budget's room)."""
    if device_bytes == plan.lora_device_bytes:
        return plan
    f = plan.forecast
    delta = device_bytes - plan.lora_device_bytes
    forecast = replace(f, device_resident_bytes=f.device_resident_bytes + delta,
                       peak_device_weight_bytes=f.peak_device_weight_bytes + delta, lora_device_bytes=device_bytes)
    return replace(plan, forecast=forecast, lora_device_bytes=device_bytes)
