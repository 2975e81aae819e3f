"""Apply a plan to a loaded pipeline: stream DiT blocks, stage or place auxiliaries, and undo it all.

Per component (engine/planning/plan.py decides the residency):
- `streamed` (a DiT or a UNet): its non-block modules go to the device (a UNet's `down_blocks` and the
  like count as block modules: their units stream); its block lists feed one
  `LayerwiseStreamer` ring across all denoisers in execution order (a UNet's skip connections are
  activations and stay where its blocks put them), which keeps exactly the blocks
  `plan.residency` marks resident and allocates exactly `plan.residency.slots` slots.
- `staged`: a `ModuleStager` with a pinned master (an encoder streamed layer by layer: a `LayerStage`,
  engine/loading/lean_apply.py, which also applies VAE tiling/slicing and feed-forward chunking), wrapped around
  the methods the pipeline calls (`forward`; for VAEs also `encode`/`decode`), sharing one
  `AllocatorCache` for boundary decisions.
- `resident`: `.to(device)` once, never staged.

`Placement.release()` undoes everything (hooks, wrappers, slots, pinned arenas) and is safe to
call after a partial placement — the load path relies on that to leave nothing behind on failure.
Returning the freed device memory (gc, `empty_cache`) is the engine's job, once it has also
dropped the pipeline that still references the modules.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ...offload.bounce_pool import BouncePool
from ...offload.cache import AllocatorCache
from ...offload.deferred_weights import DeferredWeights
from ...offload.devices import synchronize
from ...offload.events import EventBus, LogEvent
from ...offload.file_stager import FileStager
from ...offload.layer_stage import LayerStage
from ...offload.module_hooks import Hooks
from ...offload.options import LoadOptions
from ...offload.page_release import release_moved_pages
from ...offload.pinned import HostArena
from ...offload.process_memory import release_freed_heap
from ...offload.staged_calls import LazyStages, stage_around
from ...offload.stager import ModuleStager
from ...offload.streamer import LayerwiseStreamer
from ...offload.upcast import module_upcast, upcast_in_place
from ..errors import ConfigError
from ..model_dir.roles import DENOISER_ROLES
from ..options import EngineOptions
from ..planning.plan import Plan
from ..planning.tier_support import unsupported_tiers
from .expert_switch import ExpertSwitch
from .file_sources import FileSources, file_sources
from .lean_apply import apply_module_lean, make_stager
from .loader import LoadCancelled
from .stream_dtype import STREAM_DTYPES, apply_storage_hooks, cast_for_storage, compute_dtype_of

DEFAULT_OPTIONS = EngineOptions()
STAGED_METHODS = {"vae": ("forward", "encode", "decode"), "encoder": ("forward",)}


@dataclass
class Placement:
    """What was placed, so that it can be reported and undone."""

    device: torch.device
    streamer: LayerwiseStreamer | None = None
    stagers: dict[str, ModuleStager | LayerStage] = field(default_factory=dict)
    resident: list[str] = field(default_factory=list)
    undo: list[Callable[[], None]] = field(default_factory=list)
    cache: AllocatorCache | None = None
    live: bool = False  # every encoder/VAE has a master and the streamer keeps every block's: replannable
    experts: ExpertSwitch | None = None  # two experts sharing the budget (Wan 2.2 A14B)
    relean: Callable[[Plan], None] | None = None  # re-applies VAE tiling/slicing and FF chunking (re-plan)
    lazy: LazyStages = field(default_factory=LazyStages)  # stagers a direct submodule call loaded (staged_calls)
    # one bounce ring lent in turn to the DiT's file-tier reads and each layer-streamed encoder's (bounce_pool.py)
    bounce_pool: BouncePool = field(default_factory=BouncePool)

    def load_options(self, options: EngineOptions) -> LoadOptions:
        """`options.load_options` with this load's shared bounce ring."""
        return replace(options.load_options, bounce_pool=self.bounce_pool)

    @property
    def pinned_bytes(self) -> int:
        streamed = self.streamer.pinned_bytes if self.streamer else 0
        return streamed + sum(s.pinned_bytes for s in self.stagers.values())

    @property
    def host_master_bytes(self) -> int:
        """Host bytes kept for weights (page-locked or not: a CPU locks nothing): the streamer's arena and bounce
        ring, each stager's masters (a file-tier one: only the bytes no file holds)."""
        streamed = self.streamer.host_bytes if self.streamer else 0
        held = 0
        for s in self.stagers.values():
            inner = s.stager if isinstance(s, LayerStage) else s
            held += inner.held_host_bytes if isinstance(inner, FileStager) else 0
            held += sum(s.host_storages().values())
        return streamed + held

    def release(self) -> None:
        """Undo every placement step taken so far (idempotent)."""
        while self.undo:
            step = self.undo.pop()
            with contextlib.suppress(Exception):  # keep releasing the rest
                step()
        if self.streamer is not None:
            self.streamer.detach()
            self.streamer = None
        for stager in self.stagers.values():
            stager.close()
        self.stagers.clear()
        self.bounce_pool.close()


def _dit_non_block_to(module: torch.nn.Module, block_attrs: set[str], device: torch.device,
                      weights: DeferredWeights | None) -> None:
    """Move a DiT's modules other than its block lists (embeddings, norms, projections); off the host, their freed
    host copies go back to the kernel at once (glibc keeps those under its mmap threshold: see
    offload/resident_blocks.py `move_resident`)."""
    outside = [t for name, child in module.named_children() if name not in block_attrs
               for t in (*child.parameters(), *child.buffers())]
    outside += [*module.parameters(recurse=False), *module.buffers(recurse=False)]
    if weights is not None:  # still in their files: read them in first (small next to the blocks)
        weights.materialize(outside)
    # the host bytes, held until their pages are given back (views into the DiT's arena: offload/page_release.py)
    old = [t.detach() for t in outside]
    for name, child in module.named_children():
        if name not in block_attrs:
            child.to(device)
    for param in module.parameters(recurse=False):
        param.data = param.data.to(device)
    for name, buf in list(module.named_buffers(recurse=False)):
        setattr(module, name, buf.to(device))
    if device.type != "cpu":
        release_moved_pages(old)
        del old
        release_freed_heap()


def _non_block_upcast(module: torch.nn.Module, block_attrs: set[str], compute: torch.dtype) -> None:
    for name, child in module.named_children():
        if name not in block_attrs:
            module_upcast(child, compute)
    upcast_in_place([*module.parameters(recurse=False), *module.buffers(recurse=False)], compute)


def begin_placement(device: torch.device, bus: EventBus, *, live: bool = False) -> Placement:
    """An empty placement to place into: `place_streamed`, then `place_others` (undo: `release`).

    `live=True` keeps a pinned master of everything that a re-plan may move: resident encoders/VAEs
    are stagers held on the device, and the streamer keeps every block's master (see `replan`)."""
    placement = Placement(device, live=live)
    placement.cache = AllocatorCache(device, bus=bus)
    return placement


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise LoadCancelled("load cancelled")


def place_streamed(dits: dict[str, Any], plan: Plan, placement: Placement, bus: EventBus, *,
                   progress: Callable[[str, int, int], None] | None = None,
                   cancel: threading.Event | None = None,
                   weights: DeferredWeights | None = None, group: Any = None,
                   blocks_read: Callable[[], None] | None = None, options: EngineOptions = DEFAULT_OPTIONS) -> None:
    """Place the plan's streamed DiTs (by component name): their non-block modules on the device,
    their block lists into one `LayerwiseStreamer` ring. Needs only the DiTs, not the pipeline, so
    the other components may still be loading.

    `weights` holds the sources of tensors still in their files (`engine.loading.direct_load`): blocks are
    read straight into the arena, the rest into host tensors before it moves. `group` (a
    torch.distributed process group) shards the blocks across its ranks
    (`offload.allgather_streamer`). `blocks_read()` is called once, from a reader thread, when the last
    block byte is in the arena (page-locking may still be finishing). `options`: the streamer's arena
    (`EngineOptions.load_options`) and an AllGather rank's gathers (`.stream_options`)."""
    device = placement.device
    if plan.experts and group is not None:
        raise ConfigError("two experts (transformer, transformer_2) are not streamed across several GPUs yet: "
                          "use one GPU")
    keep_masters = placement.live or bool(plan.experts)  # an expert's resident blocks move at each switch
    block_lists: list[tuple[str, list[torch.nn.Module]]] = []
    compute: torch.dtype | None = None  # fp8 storage: the dtype blocks are upcast to (offload/upcast.py)
    for comp in plan.components:
        _check_cancel(cancel)
        module = dits.get(comp.info.name)
        if comp.residency != "streamed" or not isinstance(module, torch.nn.Module):
            continue
        lists = comp.info.block_lists
        tops = {b.attr.split(".")[0] for b in lists}
        if plan.stream_dtype is not None:
            compute = compute_dtype_of(module)
            cast_for_storage(module, STREAM_DTYPES[plan.stream_dtype], weights=weights,
                             modulation=plan.policy.fp8_modulation)
        _dit_non_block_to(module, tops, device, weights)
        if compute is not None:  # the non-block layers cast to fp8 are resident: converted once
            _non_block_upcast(module, tops, compute)
        block_lists.extend((f"{comp.info.name}.{b.attr}", block_modules(module, b.attr, b.items)) for b in lists)
    if not block_lists:
        return
    total = sum(c.host_bytes for c in plan.components if c.residency == "streamed")
    if keep_masters:  # every block is packed, resident ones too
        total = sum(b.nbytes for b in plan.blocks)

    once = threading.Lock()  # reader threads report at once: the first to see the total tells, no other

    def on_pack(done: int, _total: int) -> None:
        _check_cancel(cancel)
        if progress:
            progress(f"{plan.model.block_kind} blocks", done, _total)
        if blocks_read is not None and done >= _total and once.acquire(blocking=False):
            blocks_read()

    _check_block_order(block_lists, plan)
    streamer_kwargs: dict[str, Any] = {}
    streamer_cls: type[LayerwiseStreamer] = LayerwiseStreamer
    if group is not None:
        from ...offload.allgather_streamer import AllGatherStreamer

        streamer_cls, streamer_kwargs = AllGatherStreamer, {"group": group, "stream_options": options.stream_options}
    if not plan.tiers.all_pinned and plan.tiers.blocks:
        if group is not None:
            raise ConfigError(unsupported_tiers(plan, live=placement.live, ranks=group is not None)
                              or "the page-cache and disk tiers do not apply to this load")
        streamer_kwargs["tiers"] = tuple(plan.tiers.block(i) for i in range(len(plan.blocks)))
    placement.streamer = streamer_cls(block_lists, device, residency=plan.residency, bus=bus, pin=options.pin,
                                      progress=on_pack, keep_masters=keep_masters, weights=weights,
                                      active=plan.active_blocks, compute_dtype=compute,
                                      load_options=placement.load_options(options), **streamer_kwargs)
    placement.streamer.attach()
    s = placement.streamer
    if plan.experts:
        switch = ExpertSwitch(s, plan.experts, [dits[e.name] for e in plan.experts], bus)
        placement.experts = switch
        placement.undo.append(switch.close)
        bus.publish(LogEvent(level="info", message=(
            f"two experts ({', '.join(e.name for e in plan.experts)}): one runs per forward, so the running "
            f"one's {plan.experts[0].residency.num_resident} resident blocks and ring take the device; "
            "they change hands at the boundary step")))
    ring = (f"a ring of {s.slot_bytes:,} bytes ({s.num_slots} largest units; the next units copied while they fit)"
            if s.residency.byte_ring else
            f"{s.num_slots} slot{'s' if s.num_slots != 1 else ''} of {s.largest_block_bytes:,} bytes")
    bus.publish(LogEvent(level="info", message=(
        f"DLO: {s.num_streamed} blocks streamed ({total:,} bytes), {s.num_resident} resident, {ring}")))
    if s.bounce_bytes:
        by_tier = s.tier_bytes()
        bus.publish(LogEvent(level="info", message=(
            f"host tiers of the {'blocks of both experts' if plan.experts else 'streamed blocks'}: pinned "
            f"{by_tier['pinned']:,} bytes, page cache "
            f"{by_tier['page_cache']:,}, disk {by_tier['disk']:,}; read through a bounce ring of "
            f"{s.bounce_bytes:,} bytes")))


def place_others(pipe: Any, plan: Plan, placement: Placement, bus: EventBus, *,
                 progress: Callable[[str, int, int], None] | None = None,
                 cancel: threading.Event | None = None,
                 weights: DeferredWeights | None = None, host_arenas: dict[str, HostArena] | None = None,
                 options: EngineOptions = DEFAULT_OPTIONS, files: dict[str, FileSources] | None = None) -> None:
    """Place every component that is not streamed: staged (a stager with a pinned master) or resident.

    `host_arenas` holds the arenas transformers components were built over (`engine.loading.arena_load`):
    a staged one keeps its arena as its master until release, a resident one frees it once moved.
    Encoders and VAEs stay rank-local under AllGather. Ends by checking that every tensor waiting in
    `weights` was read. `options.load_options`: the stagers' masters. `files`: the file sources of the components the
    plan keeps in the page cache or on disk, found as they were built (engine/loading/file_sources.py); one not there
    is looked up here."""
    device, host_arenas = placement.device, host_arenas if host_arenas is not None else {}
    _close_lazy_stages_at_denoise(pipe, plan, placement)
    for comp in plan.components:
        _check_cancel(cancel)
        info = comp.info
        module = getattr(pipe, info.name, None)
        if comp.residency == "streamed" or not isinstance(module, torch.nn.Module):
            continue
        live_aux = placement.live and plan.policy.mode == "dlo" and info.role in ("encoder", "vae")
        if weights is not None:
            weights.materialize_module(module)
        arena = host_arenas.pop(info.name, None)
        if arena is not None:
            placement.undo.append(_closer(arena, device))  # a resident component drops it at once, below
        if comp.residency == "resident" and not live_aux:
            if info.role in DENOISER_ROLES and plan.stream_dtype is not None:  # diffusers' own layerwise casting
                apply_storage_hooks(module, STREAM_DTYPES[plan.stream_dtype], compute_dtype_of(module),
                                    modulation=plan.policy.fp8_modulation)
            module.to(device)
            if arena is not None:
                placement.undo.pop()()
            placement.resident.append(info.name)
            bus.publish(LogEvent(level="info", message=f"{info.name}: resident on {device} ({comp.why})"))
        elif comp.residency == "staged" or (comp.residency == "resident" and live_aux):
            stager = _stager(info, module, plan, placement, bus, comp.residency == "staged", options,
                             (files or {}).pop(info.name, None))
            if arena is not None and arena.tensor.data_ptr() not in stager.host_storages():
                placement.undo.pop()()  # its master is a copy (a dtype the load converted): never hold both
            placement.stagers[info.name] = stager
            placement.undo.append(stage_around(stager, module, _methods_for(module, info.role), placement.lazy))
            placement.undo.append(report_execution_device(module, device))
            if comp.residency == "resident":
                stager.hold(True)
                placement.resident.append(info.name)
            state = "resident, with a host master for re-plans" if comp.residency == "resident" else "staged"
            bus.publish(LogEvent(level="info", message=f"{info.name}: {state} ({comp.why}); {_master_text(stager)}"))
        if progress:
            progress(info.name, info.nbytes, info.nbytes)
    apply_module_lean(pipe, plan, bus)
    placement.relean = lambda new: apply_module_lean(pipe, new, bus)
    if weights is not None and weights.pending:
        raise RuntimeError(f"{weights.pending} weight tensors were never read from their files")


def _close_lazy_stages_at_denoise(pipe: Any, plan: Plan, placement: Placement) -> None:
    """An encoder a pipeline called into directly (SD 1.x's `clip_skip` norm) is offloaded when denoising
    starts, at each denoiser forward, as its wrapped forward would have been (offload/staged_calls.py)."""
    def close(*_: Any) -> None:
        if placement.lazy.open:
            placement.lazy.close()

    hooks = Hooks()
    for comp in plan.components:
        module = getattr(pipe, comp.info.name, None)
        if comp.info.role in DENOISER_ROLES and isinstance(module, torch.nn.Module):
            hooks.before(module, close, prepend=True)
    placement.undo.append(hooks.remove)


def _stager(info: Any, module: torch.nn.Module, plan: Plan, placement: Placement, bus: EventBus, staged: bool,
            options: EngineOptions, found: FileSources | None) -> ModuleStager | LayerStage:
    """The component's stager; a staged one the plan keeps in the page cache or on disk reads its weights from
    their files at each stage (engine/loading/file_sources.py, offload/file_stager.py)."""
    tier = plan.tiers.component(info.name)
    if tier != "pinned":  # staged, or resident with its files as its master (engine/planning/run_masters.py)
        if placement.live and staged:
            raise ConfigError(unsupported_tiers(plan, live=True, ranks=False)
                              or "the page-cache and disk tiers do not apply to this load")
        if found is None:
            found = file_sources(info, module, tier, keep_phase=placement.device.type == "cpu")
    try:
        return make_stager(info, module, plan, placement.device, bus, placement.cache, options.pin, staged,
                           load_options=placement.load_options(options), files=found.weights if found else None)
    finally:
        if found is not None:
            found.weights.close()  # the stager keeps duplicates of the descriptors it reads


def _master_text(stager: ModuleStager | LayerStage) -> str:
    inner = stager.stager if isinstance(stager, LayerStage) else stager
    if isinstance(inner, FileStager):
        return (f"{stager.staged_bytes:,} bytes read from the {inner.tier.replace('_', ' ')} at each stage "
                f"({inner.held_host_bytes:,} bytes kept in host memory)")
    return f"{stager.staged_bytes:,} bytes in a host master"


def _closer(arena: HostArena, device: torch.device) -> Callable[[], None]:
    def close() -> None:
        synchronize(device)  # no copy may still read it
        arena.close()
    return close


def block_modules(module: torch.nn.Module, attr: str, items: tuple[str, ...] = ()) -> list[torch.nn.Module]:
    """The blocks of one block list (`BlockList.attr`, `.items`): the units `items` names under `attr` (a
    UNet block's children, `resnets.0`), else a `ModuleList`'s entries, else `attr` itself as one unit."""
    found = module.get_submodule(attr)
    if items:
        return [found.get_submodule(item) for item in items]
    return list(found) if isinstance(found, torch.nn.ModuleList) else [found]


def _check_block_order(block_lists: list[tuple[str, list[torch.nn.Module]]], plan: Plan) -> None:
    """The loaded block lists must be the plan's blocks, in its order, or its residency would shift."""
    loaded = [f"{name}.{i}" for name, modules in block_lists for i in range(len(modules))]
    planned = [f"{b.dit}.{b.attr}.{b.index}" for b in plan.blocks]
    if loaded != planned:
        raise RuntimeError(f"loaded DiT blocks differ from the plan's ({len(loaded)} loaded, {len(planned)} planned)")


def report_execution_device(module: torch.nn.Module, device: torch.device) -> Callable[[], None]:
    """Make `module.device` name where the module runs, not where its staged weights rest.

    diffusers moves a component's inputs to `get_module_execution_device(component)`, which is
    `component.device` (its first weight's device) without accelerate hooks — the host for a staged
    component, whose weights reach the device only inside the call. Returns the undo.
    """
    cls = type(module)
    module.__class__ = type(cls.__name__, (cls,), {"device": property(lambda _self: device),
                                                   "__module__": cls.__module__})

    def undo() -> None:
        module.__class__ = cls

    return undo


def _methods_for(module: torch.nn.Module, role: str) -> tuple[str, ...]:
    return tuple(m for m in STAGED_METHODS.get(role, ("forward",)) if callable(getattr(module, m, None)))
