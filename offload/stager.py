"""Staging of an auxiliary component (text encoder, VAE) onto the device for its stage only.

`module.to("cpu")` after every use copies every weight back to the host; inference weights never
change, so the stager keeps one host master per underlying storage (in one arena, page-locked on
CUDA) and "offloading" is only re-pointing each tensor back to its master: no device-to-host copy.

Each Parameter/buffer is re-pointed to a view with its original storage offset, shape, stride and
dtype into the copy of its storage, so tied weights and views of one storage stay aliased on the
device and on the host.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .address_phase import phase_of, place_like
from .cache import AllocatorCache
from .devices import (
    as_device,
    current_stream,
    empty_cache,
    is_cuda,
    new_stream,
    rebind,
    storage_bytes,
    storage_key,
    stream_context,
    synchronize,
    unview_buffers,
)
from .events import EventBus, NullBus, OomRetry, StagingEvent
from .module_hooks import Listeners
from .pinned import ALIGNMENT, HostArena, align_up
from .storage_spans import byte_range, used_spans
from .transfer_timing import TransferClock


@dataclass(slots=True)
class _Target:
    tensor: torch.Tensor
    storage_offset: int  # in elements of dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass(slots=True)
class _Group:
    """Tensors using one byte span of a physical storage, and the host master holding those bytes."""

    nbytes: int
    targets: list[_Target]
    master: torch.Tensor | None = None  # uint8, the span's bytes
    pinned: bool = False
    phase: int = 0  # the source storage's address modulo a page (see address_phase)
    in_place: bool = False  # the master is the source's own host storage (not a copy in our arena)
    source: tuple[int, int] = (0, 0)  # (the source storage's address, its bytes): a view keeps it all alive


def _view_of(storage_u8: torch.Tensor, t: _Target) -> torch.Tensor:
    """A tensor over `storage_u8`'s storage exactly like the original (offset, shape, stride, dtype)."""
    base = storage_u8.storage_offset()  # bytes: a master may sit at an offset inside the arena
    itemsize = t.dtype.itemsize
    if base % itemsize:
        raise ValueError(f"storage base {base} is not aligned to {t.dtype}")
    out = torch.empty(0, dtype=t.dtype, device=storage_u8.device)
    return out.set_(storage_u8.untyped_storage(), base // itemsize + t.storage_offset, t.shape, t.stride)


def default_allocate(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


class ModuleStager:
    """Loads a module's weights to the device before its stage and re-points them to host after."""

    def __init__(
        self,
        name: str,
        module: torch.nn.Module,
        device: torch.device | str,
        *,
        bus: EventBus | None = None,
        cache: AllocatorCache | None = None,
        pin: bool = True,
        copy_stream: Any = None,
        exclude: Sequence[torch.nn.Module] = (),
        huge_pages: bool = True,
        in_place: bool = False,
    ) -> None:
        """`in_place`: host spans are the masters as they are even where not page-locked (unless pinning is
        asked for): a streamed encoder whose ring reads its layers from that same storage
        (offload/layer_stage.py) would otherwise hold a copy of its embeddings beside the original."""
        self.name = name
        self._in_place = in_place
        # submodules whose weights are not staged here (a streamed encoder's layers: offload/layer_stage.py)
        self._excluded = {id(t) for m in exclude for t in (*m.parameters(), *m.buffers())}
        self.module = module
        self.device = as_device(device)
        self._cuda = is_cuda(self.device)
        self._bus = bus or NullBus()
        self._cache = cache
        self._copy_stream = copy_stream if copy_stream is not None else new_stream(self.device)
        self._clock = TransferClock(self._cuda)
        self.allocate: Callable[[int, torch.device], torch.Tensor] = default_allocate
        """Device allocation per storage group; replaceable (tests inject out-of-memory here)."""
        self._device_storages: list[torch.Tensor] = []
        self._arena: HostArena | None = None
        self._huge_pages = huge_pages  # the master's arena may use huge pages (LoadOptions.use_huge_pages)
        self.loaded = False
        self.held = False  # resident: loaded once and kept between stages (a live re-plan can release it)
        self.changed = Listeners()  # called after each load and offload, ok or not (the residency watch)
        self._groups = self._snapshot(pin and self._cuda)

    # ------------------------------------------------------------------ properties

    @property
    def staged_bytes(self) -> int:
        """Bytes moved by one load: the sum of the host masters' sizes."""
        return sum(g.nbytes for g in self._groups)

    @property
    def pinned_bytes(self) -> int:
        """Page-locked bytes of the masters: our arena as registered (alignment gaps included) and the
        pinned storages used in place, each whole and once (a span's view keeps its whole storage alive)."""
        arena = self._arena.pinned_bytes if self._arena is not None and self._arena.pinned else 0
        return arena + sum(dict(g.source for g in self._groups if g.in_place and g.pinned).values())

    @property
    def closed(self) -> bool:
        return not self._groups and self._arena is None

    def host_storages(self) -> dict[int, int]:
        """{address: bytes} of each host storage the masters keep alive: our arena and the sources used in
        place (placement closes a component's load arena at once when it is not among them)."""
        held = dict(g.source for g in self._groups if g.in_place)
        if self._arena is not None and not self._arena.closed:
            held[self._arena.tensor.data_ptr()] = self._arena.nbytes
        return held

    # ------------------------------------------------------------------ snapshot

    def _snapshot(self, pin: bool) -> list[_Group]:
        """Group tensors by the byte span of a storage they use and move each span into one host master.

        A span, not the whole storage: a component read into one host arena (engine/loading/arena_load.py) has a
        single storage under every weight, and a streamed encoder's stager (offload/layer_stage.py)
        stages only the weights outside its layers, a small part of it."""
        groups, sources, in_place = self._spans(pin)
        self._masters(groups, sources, in_place, pin)
        for g in groups:
            self._point_to_master(g)
        return groups

    def _spans(self, pin: bool) -> tuple[list[_Group], list[torch.Tensor], list[bool]]:
        """The groups (a byte span of a storage and the tensors in it), each span's host bytes, and whether
        that span is used in place as its master."""
        unview_buffers(self.module)  # a view buffer's base would keep the original storage alive
        by_storage: dict[Any, list[torch.Tensor]] = {}
        seen: set[int] = set()
        for t in [*self.module.parameters(), *self.module.buffers()]:
            if id(t) in seen or id(t) in self._excluded:
                continue
            seen.add(id(t))
            if t.is_meta:
                raise ValueError(f"{self.name}: {_name_of(self.module, t)} was never loaded: its config declares a "
                                 "tensor its weight files do not hold (config and weights disagree)")
            by_storage.setdefault(storage_key(t), []).append(t)
        groups: list[_Group] = []
        sources: list[torch.Tensor] = []  # each group's bytes on the host (a uint8 view of its span)
        in_place: list[bool] = []  # host spans used in place (pinned, or no pinning asked); the rest go to one arena
        for tensors in by_storage.values():
            whole = storage_bytes(tensors[0])
            # a pinned host span is the master as it is; a pageable one too where asked (`in_place`)
            pinned_source = whole.device.type == "cpu" and (whole.is_pinned() if pin else self._in_place)
            ranges = [byte_range(t) for t in tensors]
            spans = used_spans(ranges, whole.numel())
            members: list[list[torch.Tensor]] = [[] for _ in spans]
            starts = [a for a, _ in spans]
            for t, (first, _) in zip(tensors, ranges, strict=True):  # the span its first byte lies in
                members[bisect.bisect_right(starts, first) - 1].append(t)
            for (start, end), inside in zip(spans, members, strict=True):
                targets = [_Target(t, t.storage_offset() - start // t.dtype.itemsize, tuple(t.shape),
                                   tuple(t.stride()), t.dtype) for t in inside]
                phase = phase_of(whole.data_ptr() + start, max(t.dtype.itemsize for t in inside))
                groups.append(_Group(nbytes=end - start, targets=targets, phase=phase,
                                     source=(whole.data_ptr(), whole.numel())))
                sources.append(whole[start:end])
                in_place.append(pinned_source)
        return groups, sources, in_place

    def _masters(self, groups: list[_Group], sources: list[torch.Tensor], in_place: list[bool], pin: bool) -> None:
        """Each group's host master: its span in place, or a copy in one arena (page-locked once filled)."""
        offsets: dict[int, int] = {}
        cursor = 0
        for i, g in enumerate(groups):
            if not in_place[i]:
                offsets[i] = cursor
                cursor = align_up(cursor + g.nbytes, ALIGNMENT)
        # pinned once filled
        self._arena = HostArena(cursor, pin=False, huge_pages=self._huge_pages) if offsets else None
        for i, g in enumerate(groups):
            if i in offsets:
                assert self._arena is not None
                g.master = self._arena.tensor[offsets[i] : offsets[i] + g.nbytes]
                g.master.copy_(sources[i])
            else:
                g.master = sources[i].detach()
                g.in_place, g.pinned = True, sources[i].is_pinned()
        if self._arena is not None:
            if pin:
                self._arena.pin()
            for i in offsets:
                groups[i].pinned = self._arena.pinned

    # ------------------------------------------------------------------ load / offload

    def load(self) -> None:
        """Put the weights on the device (idempotent); one retry after out-of-memory."""
        try:
            self._load()
        finally:
            self.changed()

    def _load(self) -> None:
        if self.loaded:
            return
        if self.closed:
            raise RuntimeError(f"stager {self.name} is closed")
        try:
            self._load_once()
            return
        except torch.OutOfMemoryError as exc:
            self._restore(context=f"out of memory loading {self.name}")
            self._bus.publish(OomRetry(component=self.name, nbytes=self.staged_bytes, attempt=1, message=str(exc)))
        except BaseException:
            self._restore(context=f"failed loading {self.name}")
            raise
        try:
            self._load_once()
        except BaseException:
            self._restore(context=f"retry failed loading {self.name}")
            raise

    def _load_once(self) -> None:
        # Allocate on the compute stream so the allocator can reuse blocks freed by earlier stages.
        storages = [place_like(self.allocate, g.nbytes, self.device, g.phase) for g in self._groups]
        self._device_storages = storages
        nbytes = self.staged_bytes
        if self._cuda:
            compute = current_stream(self.device)
            stream = self._copy_stream
            stream.wait_stream(compute)
            with stream_context(stream):
                mark = self._clock.start(stream)
                for g, dev in zip(self._groups, storages, strict=True):
                    assert g.master is not None
                    dev.copy_(g.master, non_blocking=g.pinned)
                ready = self._clock.finish(mark, "copy", self.name, nbytes, stream=stream)
            for g, dev in zip(self._groups, storages, strict=True):
                self._point_to(g, dev)
            compute.wait_event(ready)
        else:
            mark = self._clock.start()
            for g, dev in zip(self._groups, storages, strict=True):
                assert g.master is not None
                dev.copy_(g.master)
            self._clock.finish(mark, "copy", self.name, nbytes)
            for g, dev in zip(self._groups, storages, strict=True):
                self._point_to(g, dev)
        self.loaded = True
        self._publish_copies(wait=False)

    def hold(self, on: bool) -> int:
        """Keep the weights on the device between stages (`on`: resident) or go back to staging them.

        The master stays either way, so a live re-plan switches a component between resident and
        staged without reading disk. Returns the bytes copied to the device (0 when releasing)."""
        if on == self.held:
            return 0
        if on:
            was_loaded = self.loaded
            self.load()
            self.held = True
            return 0 if was_loaded else self.staged_bytes
        self.held = False
        self.offload()
        return 0

    def offload(self) -> None:
        """Point the weights back at their host masters and free the device copies (idempotent).

        No bytes are copied back (weights are immutable); the published d2h StagingEvent carries
        nbytes=0 and the time the boundary took (one synchronize plus re-pointing).
        """
        try:
            self._offload()
        finally:
            self.changed()

    def _offload(self) -> None:
        if not self.loaded:
            return
        mark = self._clock.start(current_stream(self.device))
        try:
            synchronize(self.device)
            for g in self._groups:
                self._point_to_master(g)
        except BaseException:
            self._restore(context=f"failed offloading {self.name}")
            raise
        self._device_storages = []
        self.loaded = False
        self._publish_copies(wait=True)
        seconds = self._wall_since(mark)
        self._bus.publish(StagingEvent(target=self.name, direction="d2h", nbytes=0, seconds=seconds))
        self._release(force=False, context=f"after offloading {self.name}")

    def close(self) -> None:
        """Offload if needed and drop the masters and the arena; the module is unusable afterwards."""
        if self.closed:
            return
        if self.loaded:
            self.offload()
        self._groups = []
        if self._arena is not None:
            self._arena.close()
            self._arena = None

    # ------------------------------------------------------------------ helpers

    def _wall_since(self, mark: Any) -> float:
        if self._cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record(current_stream(self.device))
            end.synchronize()
            return max(mark.elapsed_time(end), 0.0) / 1000.0
        return time.perf_counter() - mark

    def _publish_copies(self, *, wait: bool) -> None:
        measured = self._clock.drain() if (wait and self._cuda) else self._clock.poll()
        for m in measured:
            self._bus.publish(StagingEvent(target=m.target, direction="h2d", nbytes=m.nbytes, seconds=m.seconds,
                                           t=m.t))

    def _restore(self, *, context: str) -> None:
        """Back to the host masters after a failure, device copies dropped, cache force-released."""
        with contextlib.suppress(Exception):
            synchronize(self.device)  # no copy may still write into storages we are dropping
        for g in self._groups:
            self._point_to_master(g)
        self._device_storages = []
        self.loaded = False
        self._clock.discard()
        self._release(force=True, context=context)

    def _release(self, *, force: bool, context: str) -> None:
        try:
            if self._cache is not None:
                self._cache.release_if_needed(force=force, context=context)
            else:
                empty_cache(self.device)
        except Exception:
            if not force:
                raise  # on failure paths the original error matters more than the cleanup

    def _point_to(self, g: _Group, storage_u8: torch.Tensor) -> None:
        for t in g.targets:
            rebind(t.tensor, lambda t=t: _view_of(storage_u8, t))

    def _point_to_master(self, g: _Group) -> None:
        assert g.master is not None
        self._point_to(g, g.master)


def _name_of(module: torch.nn.Module, tensor: torch.Tensor) -> str:
    """The tensor's name in the module (for a line that says which weight is missing)."""
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if t is tensor:
            return name[:120]
    return "a tensor"
