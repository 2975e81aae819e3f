"""Carry out the plan's lean phases (engine/planning/lean.py) on a built pipeline.

- `stream_encoders` "on": each staged encoder with a layer list gets a `LayerStage` (its layers
  streamed through a 2-slot ring, the rest staged) instead of a whole-module `ModuleStager`;
- `vae_tiling` / `vae_slicing`: diffusers' own `enable_tiling()` / `enable_slicing()` on every VAE that
  has them (each class's defaults), `disable_*` when off, so a re-plan between requests switches them;
- `ff_chunking`: diffusers' `enable_forward_chunking()` on the denoisers whose class has it.
Each change is a log line, so the operator sees what ran.
"""

from __future__ import annotations

from typing import Any

import torch

from ...offload.cache import AllocatorCache
from ...offload.deferred_weights import DeferredWeights
from ...offload.events import EventBus, LogEvent
from ...offload.file_stager import FileStager
from ...offload.layer_stage import LayerStage
from ...offload.options import DEFAULT_LOAD, LoadOptions
from ...offload.stager import ModuleStager
from ..model_dir.discovery import ComponentInfo
from ..model_dir.encoder_layers import layer_modules
from ..planning.lean import streamable
from ..planning.plan import Plan


def make_stager(info: ComponentInfo, module: torch.nn.Module, plan: Plan, device: torch.device, bus: EventBus,
                cache: AllocatorCache | None, pin: bool, staged: bool = True,
                load_options: LoadOptions = DEFAULT_LOAD, files: DeferredWeights | None = None
                ) -> ModuleStager | LayerStage:
    """A component's stager: a `LayerStage` for a staged encoder the plan streams, else a `ModuleStager`
    (`staged=False`: a resident one with a master for re-plans, never streamed); `load_options`: how
    their host masters are allocated. `files`: the sources of its tensors (engine/loading/file_sources.py) when
    its tier (`plan.tiers.component`) is the page cache or disk: it is then read from there at each stage
    (offload/file_stager.py), with no host master."""
    tier = plan.tiers.component(info.name) if files is not None else "pinned"
    log = _logger(bus)
    if staged and plan.policy.lean_on("stream_encoders") and streamable(info) and info.layers is not None:
        layers = layer_modules(module, info.layers)
        if layers is not None:
            stage = LayerStage(info.name, module, layers, device, bus=bus, cache=cache, pin=pin,
                               load_options=load_options, tier=tier, files=files, log=log)
            where = "" if tier == "pinned" else f", read from the {tier.replace('_', ' ')} at each stage"
            bus.publish(LogEvent(level="info", message=(
                f"{info.name}: streamed layer by layer ({len(layers)} layers through 2 slots of "
                f"{stage.ring.largest_block_bytes:,} bytes; {stage.stager.staged_bytes:,} bytes staged around "
                f"them{where})")))
            return stage
        bus.publish(LogEvent(level="warning", message=(
            f"{info.name}: no layer list of {info.layers.count} layers found in the built module: staged whole")))
    if tier != "pinned":
        assert files is not None
        return FileStager(info.name, module, device, tier=tier, weights=files, log=log, bus=bus, cache=cache,
                          pin=pin, huge_pages=load_options.use_huge_pages)
    return ModuleStager(info.name, module, device, bus=bus, cache=cache, pin=pin,
                        huge_pages=load_options.use_huge_pages)


def _logger(bus: EventBus):  # noqa: ANN202 - a one-line log callback
    return lambda line: bus.publish(LogEvent(level="info", message=line))


def _switch(module: Any, on: bool, enable: str, disable: str) -> bool:
    """Call `module.enable`/`disable` if the class has them; True when it did."""
    method = getattr(module, enable if on else disable, None)
    if not callable(method):
        return False
    method()
    return True


def apply_module_lean(pipe: Any, plan: Plan, bus: EventBus) -> None:
    """VAE tiling and slicing, feed-forward chunking, as the plan's policy says (idempotent)."""
    policy = plan.policy
    for comp in plan.components:
        module = getattr(pipe, comp.info.name, None)
        if module is None:
            continue
        if comp.info.role == "vae":
            for name, enable, disable in (("vae_tiling", "enable_tiling", "disable_tiling"),
                                          ("vae_slicing", "enable_slicing", "disable_slicing")):
                on = policy.lean_on(name)
                was = bool(getattr(module, "use_tiling" if name == "vae_tiling" else "use_slicing", False))
                if on != was and _switch(module, on, enable, disable):
                    what = "tiled (pixels differ from an untiled decode)" if name == "vae_tiling" else \
                        "sliced (one sample at a time)"
                    bus.publish(LogEvent(level="info", message=(
                        f"{comp.info.name}: decode {what}" if on else f"{comp.info.name}: decode no longer "
                        f"{'tiled' if name == 'vae_tiling' else 'sliced'}")))
        elif comp.info.role in ("dit", "unet"):
            on, was = policy.lean_on("ff_chunking"), bool(getattr(module, "_omni_ff_chunked", False))
            if on != was and _switch(module, on, "enable_forward_chunking", "disable_forward_chunking"):
                module._omni_ff_chunked = on
                bus.publish(LogEvent(level="info", message=(
                    f"{comp.info.name}: feed-forward chunked over the batch (diffusers' enable_forward_chunking)"
                    if on else f"{comp.info.name}: feed-forward no longer chunked")))
