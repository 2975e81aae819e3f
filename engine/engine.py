"""The in-process engine: discovered → loading → ready ⇄ running, plus failed and unloaded.

Methods block; the console calls them from a worker thread (`engine.worker.EngineWorker`) and
follows progress through the event bus. Every failure during load releases what was placed
(device memory and pinned host memory) and leaves the engine `failed` with the reason, ready to
load again. A request's run (`generate`) is the `running.generation.Generation` mixin's.
"""

from __future__ import annotations

import gc
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..offload.deferred_weights import DeferredWeights
from ..offload.errors import PolicyError
from ..offload.events import EventBus, LogEvent
from ..offload.pinned import HostArena, register_seconds_total
from ..offload.policy import OffloadPolicy
from ..offload.process_memory import release_freed_heap
from ..offload.tiers import HostTiers
from .events import LoadProgress, Replanned
from .lifecycle import EngineState, EngineStateError, Lifecycle
from .loading.file_sources import FileTierLoad
from .loading.loader import LoadCancelled, pipeline_class, start_loading
from .loading.lora_apply import AppliedLoras, merge_refusal
from .loading.lora_files import check_loras
from .loading.placement import Placement, begin_placement, place_others, place_streamed
from .lora_control import LoraControl
from .model_dir.discovery import ModelInfo, discover_model
from .model_dir.quant_layouts import check_fp8_device
from .options import EngineOptions
from .plan_flow import plan_for
from .planning.lora_cost import with_lora
from .planning.plan import Plan, make_plan
from .planning.request_forecast import RequestForecast
from .planning.request_profile import RequestSize, device_name
from .planning.tier_support import unsupported_tiers
from .results import GenerateResult, LoadReport
from .running.call_options import default_fps
from .running.generation import Generation
from .running.order_watch import BlockOrderWatch, adopt_order
from .running.preview_decoder import read_preview_decoder
from .running.request_compile import RegionalCompile, start_warmup
from .running.residency_snapshot import ResidencyWatch

__all__ = ["Engine", "EngineState", "EngineStateError", "GenerateResult", "LoadReport", "default_device"]


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class Engine(Generation, LoraControl, Lifecycle):
    """One model, one policy at a time, in this process (an `api.EngineHandle`)."""

    def __init__(self, model_path: str | Path, *, device: str | torch.device | None = None,
                 bus: EventBus | None = None, variant: str | None = None, options: EngineOptions | None = None,
                 group: Any = None) -> None:
        """`options`: every load and stream switch (`engine.options.EngineOptions`; default: its defaults).
        `group`: a torch.distributed group: streamed blocks sharded across it (AllGather)."""
        options = options if options is not None else EngineOptions()
        self.model: ModelInfo = discover_model(model_path, variant)
        self.device = torch.device(device) if device is not None else default_device()
        if self.device.type == "cuda" and not torch.cuda.is_available():
            from .errors import ConfigError

            raise ConfigError(f"device {self.device} requested but CUDA is not available")
        if self.device.type == "cuda":  # a layout the GPU would run only with a kernel from the network
            check_fp8_device(self.model.components, torch.cuda.get_device_capability(self.device))
        self.bus = bus or EventBus()
        self.loras = check_loras(self.model, options.loras)  # a bad --lora: one line before anything loads
        self.preview_decoder = read_preview_decoder(options.preview_decoder) if options.preview_decoder else None
        self._loras_applied = AppliedLoras()
        # encoders and VAEs read in parallel into arenas and built on a thread beside the DiTs' reads;
        # default on CUDA only: on a CPU the library's own loader keeps the addresses address_phase needs
        aux = options.aux_in_place
        self.options = replace(options, aux_in_place=options.direct_read and (
            self.device.type == "cuda" if aux is None else aux))  # resolved for this device
        self.group = group  # a torch.distributed group: streamed blocks sharded across it (AllGather)
        if group is not None and options.live_replan:
            from .errors import ConfigError

            raise ConfigError("live re-plan keeps whole masters; AllGather keeps shards: choose one")
        self._prepared = False
        self.state = EngineState.DISCOVERED
        self.failure: str | None = None
        self.plan: Plan | None = None
        self.pipe: Any = None
        self.placement: Placement | None = None
        self._residency = ResidencyWatch(self)  # ResidencySnapshot events: the panel's rows
        self._order_watch: BlockOrderWatch | None = None
        self._compile: RegionalCompile | None = None  # --compile regional|auto (engine/running/request_compile.py)
        self._request_ids = itertools.count(1)
        self._lock = threading.RLock()

    def make_plan(self, policy: OffloadPolicy, tiers: HostTiers | None = None) -> Plan:
        """Validate a policy against this model (PolicyError) and forecast it; allocates nothing. `tiers`: the
        host tiers a `--ram-budget` chose (engine/planning/ram_plan.py), else every block pinned."""
        plan = make_plan(self.model, policy)
        if tiers is not None:
            plan = replace(plan, tiers=tiers)
        why = unsupported_tiers(plan, live=self.options.live_replan, ranks=self.world > 1)
        if why is not None:
            raise PolicyError(why)
        modes = self.lora_modes(plan)
        why = merge_refusal(plan, bool(self.loras), modes.chosen if modes is not None else self.options.lora_mode)
        if why is not None:
            raise PolicyError(why)
        return with_lora(plan, modes.device_bytes(modes.chosen)) if modes is not None else plan

    @property
    def device_name(self) -> str:
        return device_name(self.device)

    @property
    def live_replan(self) -> bool:
        """Loads keep pinned masters of everything a re-plan may move (`EngineOptions.live_replan`)."""
        return self.options.live_replan

    @property
    def world(self) -> int:
        """GPUs (ranks) serving the model: one here; `engine.ranks.group_engine.GroupEngine` has N."""
        return 1

    def forecast(self, size: RequestSize, plan: Plan | None = None, probe_bandwidth: float | None = None
                 ) -> RequestForecast | None:
        """The request forecast for `plan` (default: the loaded one) at `size` on this device, through
        `plan_for` (the one way to a forecast), with the link rate this engine's streamer has seen."""
        plan = plan or self.plan
        if plan is None:
            return None
        streamer = self.placement.streamer if self.placement else None
        observed = streamer.observed_bandwidth if streamer is not None else None
        return plan_for(self, plan, size=size, device=self.device_name, live=self.live_replan,
                        observed_bandwidth=observed, probe_bandwidth=probe_bandwidth).forecast

    # ---------------------------------------------------------------- load / unload
    def prepare(self, cancel: threading.Event | None = None) -> float:
        """Import the pipeline's and every component's class now; seconds taken (0 once done).
        (`cancel`: for `GroupEngine.prepare`'s signature; an import is not interrupted.)

        Importing diffusers' and transformers' model modules costs a fresh process about a second,
        whatever the checkpoint's size. The console does it on the engine thread when the model is
        opened, while the operator reads the plan, so a load starts reading at once; `load` calls
        it too (and reports it as the `classes_imported` milestone) when nobody did."""
        if self._prepared:
            return 0.0
        from .loading.loader import quiet_libraries
        from .model_dir.trusted_classes import component_class

        start = time.perf_counter()
        pipeline_class(self.model)
        quiet_libraries()
        for info in self.model.components:
            component_class(info.library, info.class_name, str(info.folder))
        self._prepared = True
        return time.perf_counter() - start

    def load(self, policy: OffloadPolicy, cancel: threading.Event | None = None, tiers: HostTiers | None = None
             ) -> LoadReport:
        with self._lock:
            self._check_loadable()
            plan = self.make_plan(policy, tiers)  # invalid policy: clear error before anything is allocated
            self.plan = plan
            self.failure = None
            self._set_state(EngineState.LOADING, f"mode={policy.mode}")
            start = time.perf_counter()
            registered = register_seconds_total()
            options = self.options
            weights = (DeferredWeights(options.read_threads, share_readers=options.share_readers,
                                       keep_phase=self.device.type == "cpu")
                       if options.direct_read else None)
            arenas: dict[str, HostArena] = {}
            components: dict[str, float] = {}
            milestones: dict[str, float] = {}
            aux_in_place = bool(options.aux_in_place)
            # a live load's file-tier components are resident ones whose master is their files (run_masters.py)
            file_tiers = FileTierLoad({n: t for n, t in plan.tiers.components if t != "pinned"},
                                      self.device.type == "cpu")
            # No garbage collection while the components are built: a full collection walks every
            # object the libraries' imports made, and building a model makes the thousands of objects
            # that trigger them (a Flux-size DiT built right after the imports: 0.35 s with them,
            # 0.15 s without, on a 2-core CI machine). Nothing the load makes is cyclic garbage, and a
            # failed load's release collects explicitly; collection resumes when the load ends.
            collecting = gc.isenabled()

            def mark(name: str) -> None:
                milestones[name] = time.perf_counter() - start

            warmup = None
            try:
                if self.prepare():
                    mark("classes_imported")
                # after the libraries' imports (no import races with the loading thread), beside the reads
                warmup = start_warmup(options.compile, options.compile_backend, self.device)
                gc.disable()
                with ThreadPoolExecutor(1, thread_name_prefix="arena-register") as registrar, \
                        ThreadPoolExecutor(1, thread_name_prefix="component-load") as others_on:
                    loading = start_loading(
                        self.model, progress=self._progress("host"), cancel=cancel, weights=weights,
                        log=lambda line: self.bus.publish(LogEvent(level="info", message=line)),
                        aux_in_place=aux_in_place, host_arenas=arenas, registrar=registrar, timings=components,
                        others_on=others_on if aux_in_place else None,  # CPU: the library's own order (address_phase)
                        dit_in_arena=options.dit_in_arena, huge_pages=options.use_huge_pages,
                        after_build=file_tiers.after_build, plain=frozenset(file_tiers.tiers),
                        from_files=file_tiers.build)
                    try:
                        mark("dits_built")
                        self.placement = begin_placement(self.device, self.bus, live=options.live_replan)
                        place_streamed(loading.dits, plan, self.placement, self.bus, progress=self._progress("place"),
                                       cancel=cancel, weights=weights, group=self.group,
                                       blocks_read=lambda: mark("dit_blocks_read"), options=options)
                        mark("dits_placed")
                        self.pipe = loading.finish()
                        mark("pipeline_built")
                    except BaseException:
                        loading.abandon()
                        raise
                for name, why in file_tiers.read_whole.items():  # its library read it: the load's transient
                    self.bus.publish(LogEvent(level="info", message=f"{name}: read whole into host memory once at "
                                              f"load, then given back (not built over its files: {why})"))
                if loading.others_done_at is not None:
                    milestones["others_built"] = loading.others_done_at - start
                self._pin_execution_device()
                place_others(self.pipe, plan, self.placement, self.bus, progress=self._progress("place"),
                             cancel=cancel, weights=weights, host_arenas=arenas, options=options,
                             files=file_tiers.found)
                self._apply_loras(plan)
                if options.compile != "off":
                    self._compile = RegionalCompile(options.compile, options.compile_backend,
                                                    [getattr(self.pipe, d.name) for d in self.model.denoisers],
                                                    self.device, warmup)
            except BaseException as exc:
                if warmup is not None:
                    warmup.wait()  # nothing left running on the device while the load's memory goes back
                for arena in arenas.values():
                    arena.close()
                self._release()
                reason = "load cancelled" if isinstance(exc, LoadCancelled) else f"{type(exc).__name__}: {exc}"
                self._fail("load", reason)
                raise
            finally:
                file_tiers.close()  # file-tier stagers keep duplicates of the descriptors they read
                if weights is not None:
                    weights.close()  # the files: every tensor has been read by now, or the load failed
                if collecting:
                    gc.enable()
            self._watch_block_order()
            self._residency.attach()
            release_freed_heap()  # the load's freed read buffers, left resident in its threads' heap arenas
            self._set_state(EngineState.READY)
            streamer = self.placement.streamer
            fallback = streamer.pin_fallback if streamer else None
            seconds = time.perf_counter() - start
            register_s = register_seconds_total() - registered
            read_s = max(milestones["dits_placed"], milestones.get("others_built", 0.0))  # the last read's end
            return LoadReport(
                seconds=seconds,
                phases={"read": read_s, "arrange": max(seconds - read_s, 0.0), "register": register_s},
                components=components, dit_read_seconds=weights.seconds if weights is not None else 0.0,
                milestones=milestones,
                pinned_bytes=self.placement.pinned_bytes,
                streamed_bytes=streamer.streamed_bytes if streamer else 0,
                streamed_copy_bytes=streamer.copy_bytes if streamer else 0,
                block_host_bytes=streamer.host_bytes if streamer else 0,
                pin_fallback_blocks=fallback.blocks if fallback else 0,
                pin_fallback_bytes=fallback.nbytes if fallback else 0,
                host_master_bytes=self.placement.host_master_bytes,
                device_allocated_bytes=torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else None,
            )

    def replan(self, policy: OffloadPolicy) -> Replanned:
        """Apply another policy to the loaded model between requests, moving only what changes.

        Needs a load with `live_replan=True` (pinned masters of everything). A request in flight
        finishes first (the worker runs commands in order; here the engine must be ready). Switching
        dlo ⇄ resident is a different kind of load and is refused."""
        from .loading.replan import apply_replan

        with self._lock:
            if self.state != EngineState.READY or self.placement is None or self.plan is None:
                raise EngineStateError(f"cannot re-plan while {self.state.value}; load first")
            if not self.placement.live:
                raise EngineStateError("loaded without live re-plan: unload and load again to change the policy")
            if policy.mode != self.plan.policy.mode:
                raise PolicyError("switching dlo ⇄ resident is a new load: unload (u), switch (m), load (l)")
            old = self.plan.policy
            if (policy.stream_dtype, policy.fp8_modulation) != (old.stream_dtype, old.fp8_modulation):
                raise PolicyError("changing the stream dtype is a new load: the weights are cast as they are read")
            plan = self.make_plan(policy, self.plan.tiers)  # the masters stay where the load put them
            self._remove_loras()  # resident merged bytes back first
            event = apply_replan(self.placement, self.plan, plan, self.device)
            self._apply_loras(plan)  # merged again where the blocks now are
            self.plan = plan
            self._announce_plan()  # PlanReady: the console's live screen and editor follow the engine's plan
            self.bus.publish(event)
            self._residency.attach()  # the re-planned rows (and the stagers it may have replaced)
            return event

    def _progress(self, phase: str):
        def report(component: str, done: int, total: int) -> None:
            self.bus.publish(LoadProgress(component=component, done_bytes=done, total_bytes=total, phase=phase))
        return report

    def _pin_execution_device(self) -> None:
        """diffusers infers the execution device from the first module's weights, which may be a
        staged (host) component; the engine knows where compute runs."""
        device = self.device
        cls = type(self.pipe)
        self.pipe.__class__ = type(cls.__name__, (cls,), {"_execution_device": property(lambda _self: device)})

    def unload(self) -> None:
        with self._lock:
            self._check_unloadable()
            self._release()
            self._set_state(EngineState.UNLOADED)

    def _release(self) -> None:
        if self._compile is not None:
            self._compile.close()
            self._compile = None
        if self._order_watch is not None:
            self._order_watch.close()
            self._order_watch = None
        self._residency.detach()
        if self.placement is not None:
            self.placement.release()
            self.placement = None
        self.pipe = None
        self._loras_applied = AppliedLoras()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    # ---------------------------------------------------------------- block order
    def _watch_block_order(self) -> None:
        """Record each DiT's first forward of this load: the plan's block order is checked against it."""
        assert self.plan is not None
        dits = {d.name: getattr(self.pipe, d.name, None) for d in self.model.dits if len(d.block_lists) > 1}
        lists = {d.name: d.block_lists for d in self.model.dits}
        modules = {name: m for name, m in dits.items() if isinstance(m, torch.nn.Module)}
        if modules:
            self._order_watch = BlockOrderWatch(modules, lists, self._block_order_observed)

    def _block_order_observed(self, dit: str, calls: list[tuple[str, int]]) -> None:
        """A DiT's first forward ran: adopt its block order (streamer, plan, cache) when it differs."""
        assert self.plan is not None
        streamer = self.placement.streamer if self.placement else None
        self.model, self.plan, events = adopt_order(self.model, self.plan, streamer, dit, calls)
        for event in events:
            self.bus.publish(event)

    @property
    def fps(self) -> float | None:
        """The frame rate a video from this model is written at unless the operator says otherwise."""
        return default_fps(self.model)

    def close(self) -> None:
        """Release everything (the console calls this on quit)."""
        with self._lock:
            if self.holds_anything:
                self._release()
                self._set_state(EngineState.UNLOADED, "closed")
