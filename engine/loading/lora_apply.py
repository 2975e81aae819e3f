"""Apply checked LoRAs to a placed pipeline, as diffusers applies them, with the streamed blocks still streaming.

diffusers' `load_lora_weights` injects PEFT layers around each target module; the base module and its
Parameters stay the same objects, so the streamer's bindings keep working. Its checks read each base
weight's shape, which a streamed block's zero-element placeholder does not have: while it runs, those
placeholders stand in at their true shape (`shaped_placeholders`, no memory). PEFT puts the A/B matrices on
the base weight's device: the LoRA is then resident there.

- `sidecar`: A/B applied in the forward as PEFT applies them (`set_adapters` with the scales; lora_arith.py
  leaves out PEFT's multiply by a scaling of 1.0, which changes no bit).
- `merge`: each LoRA layer's scaling multiplied by its scale as `fuse_lora(lora_scale=)` does; resident
  modules merged once now (PEFT's `merge`, what `fuse_lora` calls, as lora_arith.py reproduces it), streamed
  blocks merged into their slot each time they arrive (offload/lora_merge.py), after the fp8 upcast; the host
  masters are never touched.
  With two experts (Wan 2.2 A14B) each expert's blocks carry that expert's deltas: the running expert's
  resident blocks are merged now, the other's each time a switch copies them to the device (a switch frees
  the old ones, so nothing is unmerged there); a LoRA change copies the resident ones afresh from their masters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ...offload.devices import rebind
from ...offload.lora_merge import LayerMerge, MergeOnUpload
from ...offload.module_hooks import Hooks
from ...offload.streamer import LayerwiseStreamer
from ...offload.upcast import is_float8
from ..errors import ConfigError
from ..planning.lora_cost import LoraModes, lora_modes, merges_into_fp8
from ..planning.model_configs import fill_size
from ..planning.request_profile import RequestSize
from .lora_arith import layer_merge, merger, use_fast_forward
from .lora_files import LoraFile
from .placement import Placement

LORA_MODES = ("sidecar", "merge", "auto")


def auto_mode() -> str:
    """`--lora-mode auto` where no plan decided it (the engine resolves it by the forecast step, engine/planning/
    lora_cost.py): merge. Merging costs one B·A product per streamed linear per forward (rank·in·out
    multiply-adds); the sidecar costs 2·tokens·rank·(in+out) per linear per forward, more whenever a forward's
    tokens exceed in·out / (2·(in+out)) (768 for Flux's 3072-wide linears; a 1024² Flux image has 4,608)."""
    return "merge"


def plan_lora_modes(plan: Any, loras: list[LoraFile], device: str, mode: str) -> LoraModes | None:
    """`loras`' device bytes and cost per step of each mode under `plan` at the pipeline's default size, and the
    mode `mode` resolves to (engine/planning/lora_cost.py); None without LoRAs."""
    if not loras:
        return None
    modules = [m for f in loras for m in f.modules]
    return lora_modes(plan, modules, fill_size(plan.model, RequestSize()), device, mode)


def merge_refusal(plan: Any, loras: bool, mode: str) -> str | None:
    """Why `plan` cannot merge LoRAs (None: it can): a resident block stored in fp8 and upcast per forward would
    be merged into its fp8 storage, which corrupts it (the peers' bug). Said when the plan is made, before load
    (`auto` never resolves to merge there: engine/planning/lora_cost.py)."""
    if loras and mode == "merge" and merges_into_fp8(plan):
        return ("--lora-mode merge with fp8 resident blocks upcast per forward would merge into fp8 storage: use "
                "--lora-mode sidecar or --upcast-resident auto|N")
    return None


def adapter_names(loras: list[LoraFile]) -> list[str]:
    return [f"lora{i}" for i in range(len(loras))]


@dataclass
class AppliedLoras:
    """What `apply_loras` did, so that `remove_loras` can undo it exactly between requests."""

    names: list[str] = field(default_factory=list)
    merge: MergeOnUpload | None = None  # the streamed blocks' merge on upload (stays watching the ring)
    restore: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # resident merged: (weight, copy)
    hooks: Hooks = field(default_factory=Hooks)  # staged components' per-call merges (offload/module_hooks.py)
    shapes: list[frozenset[tuple[str, tuple[int, ...]]]] = field(default_factory=list)  # each LoRA's keys and shapes


def lora_shapes(lora: LoraFile) -> frozenset[tuple[str, tuple[int, ...]]]:
    """A LoRA's keys and their shapes: two LoRAs alike here fit the same PEFT layers (hot-swappable)."""
    return frozenset((key, tuple(t.shape)) for key, t in lora.tensors.items())


def apply_loras(pipe: Any, placement: Placement, loras: list[LoraFile], mode: str,
                applied: AppliedLoras | None = None) -> AppliedLoras:
    """Load every LoRA into `pipe` (diffusers' own loader) and apply it in `mode`. `applied`: a previous
    state already removed (`remove_loras`), whose ring watcher is reused."""
    applied = applied if applied is not None else AppliedLoras()
    applied.names = adapter_names(loras)
    applied.shapes = [lora_shapes(lora) for lora in loras]
    if applied.merge is not None:
        applied.merge.merges = {}
    if not loras:
        return applied
    _load(pipe, placement.streamer, loras, applied.names, hotswap=False)
    return _activate(pipe, placement, loras, mode, applied)


HOT_SWAPPABLE = frozenset({"transformer", "unet"})
"""Components diffusers hot-swaps a LoRA into (not the text encoders, and a second expert loads apart)."""


def switch_loras(pipe: Any, placement: Placement, applied: AppliedLoras, loras: list[LoraFile], mode: str
                 ) -> AppliedLoras:
    """Between requests: take `applied` off and apply `loras`. Where each new LoRA has the keys and shapes of the
    one in its place (another LoRA of the same layout, or the same files at other scales), diffusers' hot swap
    (`load_lora_weights(hotswap=True)`) copies the new A/B into the PEFT layers already there: no layer is
    injected or removed (PEFT's injection was most of a switch: 1.0 s of 1.3 s for 504 layers), and a compiled
    block keeps its graph. Anything else, or a hot swap diffusers refuses, unloads and loads as at first."""
    if loras and applied.names == adapter_names(loras) and applied.shapes == [lora_shapes(x) for x in loras] \
            and all(set(x.components) <= HOT_SWAPPABLE for x in loras):
        remove_loras(pipe, placement, applied, keep_adapters=True)
        try:
            _load(pipe, placement.streamer, loras, applied.names, hotswap=True)
        except Exception:  # noqa: BLE001 - diffusers refused this swap (alphas, rank patterns...): load afresh
            with shaped_placeholders(pipe, placement.streamer):
                pipe.unload_lora_weights()
            applied.names = []
        else:
            return _activate(pipe, placement, loras, mode, applied)
    else:
        remove_loras(pipe, placement, applied)
    return apply_loras(pipe, placement, loras, mode, applied)


def _load(pipe: Any, streamer: LayerwiseStreamer | None, loras: list[LoraFile], names: list[str], hotswap: bool
          ) -> None:
    with shaped_placeholders(pipe, streamer):
        for lora, name in zip(loras, names, strict=True):
            first, second = by_expert(pipe, lora.tensors)
            if first:
                pipe.load_lora_weights(first, adapter_name=name, hotswap=hotswap)
            if second:  # Wan 2.2's low-noise expert, as diffusers loads a LoRA into it
                pipe.load_lora_weights(second, adapter_name=name, load_into_transformer_2=True, hotswap=hotswap)


def _activate(pipe: Any, placement: Placement, loras: list[LoraFile], mode: str, applied: AppliedLoras
              ) -> AppliedLoras:
    """The loaded adapters on the device, then applied in `mode`: the scales set (sidecar), or merged."""
    _to_device(pipe, placement.device)
    if mode == "auto":
        mode = auto_mode()
    if mode != "merge":
        pipe.set_adapters(applied.names, [lora.scale for lora in loras])
        for component in _lora_components(pipe):
            use_fast_forward(component)
        return applied
    _merge(pipe, placement.streamer, loras, applied, frozenset(placement.stagers))
    return applied


EXPERT2 = "transformer_2."


def by_expert(pipe: Any, tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(what `load_lora_weights` loads as it is, the keys for a second expert): a file's `transformer_2.` keys are
    loaded by diffusers only with `load_into_transformer_2=True`, under the `transformer.` prefix (it would skip
    them otherwise); a pipeline without a second expert keeps every key in the first part."""
    if "transformer_2" not in getattr(pipe, "_lora_loadable_modules", ()):
        return dict(tensors), {}
    first = {k: v for k, v in tensors.items() if not k.startswith(EXPERT2)}
    second = {"transformer." + k[len(EXPERT2):]: v for k, v in tensors.items() if k.startswith(EXPERT2)}
    return first, second


def _to_device(pipe: Any, device: torch.device) -> None:
    """A/B on the device for every component: PEFT put them beside the base weight as it was at injection,
    which for a staged encoder between its calls is the host master."""
    for module in _peft_layers(pipe):
        for name in ("lora_A", "lora_B"):
            getattr(module, name).to(device)


def remove_loras(pipe: Any, placement: Placement, applied: AppliedLoras, keep_adapters: bool = False) -> None:
    """Undo `apply_loras` without reloading any base weight: resident merged weights get their saved bytes
    back (a resident block with a master: a fresh device copy of it), the PEFT layers go (diffusers'
    `unload_lora_weights`), and the ring refills its slots from the host masters, which were never written (a
    slot may hold a merged block). `keep_adapters`: the PEFT layers stay, unmerged, for a hot swap."""
    if not applied.names and not applied.restore:
        return
    applied.hooks.remove()
    for weight, saved in applied.restore:
        if weight.shape == saved.shape:  # else a re-plan has streamed it since: its master is clean
            weight.data.copy_(saved)
    applied.restore.clear()
    if keep_adapters:
        _ready_for_swap(pipe)
    elif applied.names:
        with shaped_placeholders(pipe, placement.streamer):
            pipe.unload_lora_weights()
        applied.names = []
    streamer = placement.streamer
    if applied.merge is not None:
        merged = applied.merge.merges
        applied.merge.merges = {}
        fused = [b.name for b in streamer.blocks if b.resident and b.name in merged] if streamer is not None else []
        if fused and streamer is not None and streamer.attached:
            streamer.refresh_resident(fused)
    if streamer is not None and streamer.attached and streamer.num_streamed:
        streamer.set_slots(streamer.residency.slots)  # every slot refilled from its master


def _merge(pipe: Any, streamer: LayerwiseStreamer | None, loras: list[LoraFile], applied: AppliedLoras,
           staged: frozenset[str]) -> None:
    """Streamed blocks: merged on each arrival; resident blocks with a master (two experts, live re-plan): merged
    now and on each fresh device copy (an expert switch); staged components (an encoder): merged on each call,
    into the device copy the stager made (its master untouched); everything else resident: merged once, its
    bytes saved."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    names = applied.names
    scales = dict(zip(names, (lora.scale for lora in loras), strict=True))
    blocks = {b.module: b for b in streamer.blocks} if streamer is not None else {}
    masters = streamer is not None and streamer.keep_masters
    followed = {m: b.name for m, b in blocks.items() if masters or not b.resident}  # merged where the block is
    resident = {b.name for b in blocks.values() if b.resident}
    per_block: dict[str, list[LayerMerge]] = {}
    for key, component in pipe.components.items():
        if not isinstance(component, torch.nn.Module):
            continue
        for module, block in _tuner_layers(component, followed, BaseTunerLayer):
            for name, scale in scales.items():
                if name in module.scaling and scale != 1.0:
                    module.scaling[name] *= scale  # what `fuse_lora(lora_scale=)`'s `scale_layer` does
            if key in staged:
                staged_merge = merger(module, names)
                applied.hooks.before(module, lambda _m, _a, merge=staged_merge: merge())
            elif block is not None:  # streamed, or resident with a master: merged where the block is, each time
                if block in resident:
                    _refuse_fp8(module.get_base_layer().weight)
                per_block.setdefault(block, []).append(layer_merge(module, names))
            else:  # resident: merged once, as fuse_lora merges it; its bytes kept to unmerge exactly
                merge = merger(module, names)
                base = module.get_base_layer()
                _refuse_fp8(base.weight)
                for t in (base.weight, getattr(base, "bias", None)):
                    if t is not None:
                        applied.restore.append((t, t.detach().to("cpu", copy=True)))
                merge()
    if streamer is None or not per_block:
        return
    if applied.merge is None:
        applied.merge = MergeOnUpload(per_block)
        streamer.watch_ring(applied.merge.watch)
        streamer.watch_resident(applied.merge.resident)
    else:
        applied.merge.merges = per_block
        if streamer.num_streamed:
            streamer.set_slots(streamer.residency.slots)  # refilled: each block merged on its next arrival
    for b in streamer.blocks:  # the running expert's resident blocks: merged now, the other's when a switch copies them
        if b.resident and b.name in per_block:
            applied.merge.resident(b)


def _refuse_fp8(weight: torch.Tensor) -> None:
    if is_float8(weight.dtype):
        raise ConfigError("--lora-mode merge: a resident block kept in fp8 would be merged in fp8 storage (use "
                          "--lora-mode sidecar, or --upcast-resident to keep it upcast)")


def _ready_for_swap(pipe: Any) -> None:
    """Every PEFT layer made ready for a hot swap to write into it:
    - marked unmerged: its weight has its unmerged bytes again (restored, or refilled from its master), and a hot
      swap refuses a layer PEFT believes merged;
    - its A/B in host memory given storage of their own: on a CPU they are the checked file's own tensors (nothing
      copied them), and the swap would write the next LoRA into the previous one's, which the engine keeps and may
      apply again. On a GPU they are device copies already."""
    for module in _peft_layers(pipe):
        module.merged_adapters.clear()
        for name in ("lora_A", "lora_B"):
            for param in getattr(module, name).parameters():
                if param.device.type == "cpu":
                    param.data = param.data.clone()


def _peft_layers(pipe: Any) -> Iterator[Any]:
    """Every PEFT (LoRA) layer of every component of `pipe`."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for component in _lora_components(pipe):
        for module in component.modules():
            if isinstance(module, BaseTunerLayer):
                yield module


def _lora_components(pipe: Any) -> Iterator[torch.nn.Module]:
    for value in pipe.components.values():
        if isinstance(value, torch.nn.Module):
            yield value


def _tuner_layers(component: torch.nn.Module, streamed: dict[torch.nn.Module, str], kind: type
                  ) -> Iterator[tuple[Any, str | None]]:
    """Each PEFT layer of `component` with the streamed block it lies in (None: not in a streamed block)."""
    def walk(module: torch.nn.Module, block: str | None) -> Iterator[tuple[Any, str | None]]:
        block = streamed.get(module, block)
        if isinstance(module, kind):
            yield module, block
            return
        for child in module.children():
            yield from walk(child, block)

    yield from walk(component, None)


@contextlib.contextmanager
def shaped_placeholders(pipe: Any, streamer: LayerwiseStreamer | None) -> Iterator[None]:
    """While diffusers injects or removes its PEFT layers: each streamed tensor (a zero-element placeholder, or
    bound in a slot) and each fp8-stored one stands in at its true shape in the dtype its block computes in (a
    broadcast zero: no memory), so that diffusers' shape checks see the module and PEFT keeps A/B in the compute
    dtype, never in fp8; every tensor gets its own storage back afterwards."""
    compute = streamer.compute_dtype if streamer is not None else None
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []

    def stand_in(target: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        if is_float8(dtype):
            dtype = compute or torch.float32
        saved.append((target, target.data))
        rebind(target, lambda: torch.zeros((), dtype=dtype, device=target.device).expand(shape))

    done: set[int] = set()
    for binding in streamer.streamed_bindings() if streamer is not None else ():
        if binding.target.numel() == 0 or is_float8(binding.target.dtype):
            stand_in(binding.target, binding.shape, binding.dtype)
        done.add(id(binding.target))
    for component in _lora_components(pipe):
        for t in component.parameters():
            if id(t) not in done and is_float8(t.dtype):
                stand_in(t, tuple(t.shape), t.dtype)
                done.add(id(t))
    try:
        yield
    finally:
        for target, data in reversed(saved):
            rebind(target, lambda data=data: data)
