"""Where a built component's weights are in its safetensors files, for a staged component kept in a file tier.

A staged encoder/VAE in the page-cache or disk tier (offload/file_stager.py, offload/layer_stage.py) keeps no host
master: it reads its tensors from their files at each stage. The component was built by its library (transformers
may rename, tie or convert weights on load), so a file range is taken as a tensor's source only where the file
holds that tensor's bytes exactly: same name (any of a tied tensor's names), same shape, and the stored bytes,
converted to the tensor's dtype as the load converts them, equal to the loaded bytes (read once here, in chunks).
Anything else stays a small host copy beside the reads. Files are opened with the checks every read has (regular
files inside the model folder: `open_regular`); the returned reader owns them and the stager keeps duplicates.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from ...offload.address_phase import PAGE, place_like
from ...offload.deferred_weights import DeferredWeights, Source
from ...offload.devices import rebind, storage_key
from ...offload.tiers import Tier
from ..model_dir.discovery import ComponentInfo
from .direct_load import StoredTensor, component_locations, open_fd
from .file_build import FileBuilt, build_from_files

CHECK_CHUNK = 64 << 20  # stored bytes compared per read


@dataclass(frozen=True, slots=True)
class FileSources:
    """The reader holding each matched tensor's source, and what was matched."""

    weights: DeferredWeights
    matched_bytes: int
    unmatched: int  # tensors kept as host copies (not in a file as they are)


def _names(module: torch.nn.Module) -> dict[int, tuple[torch.Tensor, list[str]]]:
    found: dict[int, tuple[torch.Tensor, list[str]]] = {}
    for name, t in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
        found.setdefault(id(t), (t, []))[1].append(name)
    return found


def _read(fd: int, offset: int, out: torch.Tensor) -> bool:
    view, done = memoryview(out.numpy()).cast("B"), 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            return False
        done += got
    return True


def same_bytes(fd: int, stored: StoredTensor, t: torch.Tensor) -> bool:
    """Whether the file range holds `t`'s bytes: stored as they are, or converted to `t`'s dtype as a load does."""
    flat = t.detach().reshape(-1)
    per = max(1, CHECK_CHUNK // stored.dtype.itemsize)
    for at in range(0, flat.numel(), per):
        k = min(per, flat.numel() - at)
        raw = torch.empty(k * stored.dtype.itemsize, dtype=torch.uint8)
        if not _read(fd, stored.offset + at * stored.dtype.itemsize, raw):
            return False
        got = raw.view(stored.dtype)
        if stored.dtype != t.dtype:
            got = got.to(t.dtype)
        if not torch.equal(got.view(torch.uint8), flat[at : at + k].view(torch.uint8)):
            return False
    return True


def file_sources(info: ComponentInfo, module: torch.nn.Module, tier: Tier, *, keep_phase: bool,
                 weights: DeferredWeights | None = None) -> FileSources:
    """A reader with the file range of every tensor of `module` its files hold as loaded (module docstring).
    For the disk tier the pages read to check are dropped from the page cache again. `weights`: a reader that
    already knows the sources of the tensors the component was built over (engine/loading/file_build.py); the
    others are checked here and added to it."""
    known = weights is not None
    weights = weights if weights is not None else DeferredWeights(1, keep_phase=keep_phase)
    try:
        stored = component_locations(info)
        fds: dict[object, int] = {}
        matched = unmatched = 0
        for t, names in _names(module).values():
            if known and weights.knows(t):
                matched += weights.source_of(t)[0].nbytes
                continue
            hit = next((stored[n] for n in names if n in stored and stored[n].shape == tuple(t.shape)), None)
            usable = (hit is not None and t.device.type == "cpu" and not t.is_meta and t.is_contiguous()
                      and t.numel() > 0)
            if usable:
                assert hit is not None
                if hit.file not in fds:
                    fds[hit.file] = open_fd(hit.file)
                    weights.own_fd(fds[hit.file])
                usable = same_bytes(fds[hit.file], hit, t)
            if not usable:
                unmatched += 1
                continue
            assert hit is not None
            weights.add(t, Source(fds[hit.file], hit.offset, hit.nbytes, hit.dtype, hit.shape))
            matched += hit.nbytes
        if tier == "disk":
            for fd in [*fds.values(), *weights.fds]:
                with contextlib.suppress(OSError, AttributeError):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except BaseException:
        weights.close()
        raise
    return FileSources(weights, matched, unmatched)


def release_file_bytes(module: torch.nn.Module, weights: DeferredWeights) -> int:
    """Give back the host bytes of every storage of `module` whose tensors all have a file source, right after the
    component is built (so that a load holds one file-tier component's bytes at a time, not all of them until
    placement): each such storage's tensors move to one untouched storage of the same size at the same address
    phase (no resident pages until written; the stager reads the real bytes from the files). Returns the bytes."""
    by_storage: dict[object, list[torch.Tensor]] = {}
    for t, _ in _names(module).values():
        if t.device.type == "cpu" and not t.is_meta:
            by_storage.setdefault(storage_key(t), []).append(t)
    released = 0
    for tensors in by_storage.values():
        if not all(weights.knows(t) for t in tensors):
            continue  # a tensor no file holds as loaded shares these bytes: they stay
        old = tensors[0].untyped_storage()
        fresh = place_like(lambda n, _d: torch.empty(n, dtype=torch.uint8), old.nbytes(), torch.device("cpu"),
                           old.data_ptr() % PAGE)
        for t in tensors:
            rebind(t, lambda t=t, fresh=fresh: _same_view(fresh, t))
        released += old.nbytes()
    return released


def _same_view(fresh: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """`t` (offset, shape, stride, dtype) over the uint8 storage `fresh` instead of its own."""
    base = fresh.storage_offset()
    out = torch.empty(0, dtype=t.dtype)
    return out.set_(fresh.untyped_storage(), base // t.dtype.itemsize + t.storage_offset(), t.shape, t.stride())


class FileTierLoad:
    """The load's side of file-tier components: each built with its weights still in their files where it can be
    (`build`, engine/loading/file_build.py: nothing read), else by its library and its bytes given back; their
    sources found as each is built (`after_build`, the loader's hook), kept for placement (`found`), closed at the
    end (`close`). `read_whole`: the components that had to be read whole into host memory once, and why."""

    def __init__(self, tiers: dict[str, Tier], keep_phase: bool) -> None:
        self.tiers = dict(tiers)
        self._keep_phase = keep_phase
        self.found: dict[str, FileSources] = {}
        self._built: dict[str, FileBuilt] = {}
        self.read_whole: dict[str, str] = {}

    def build(self, info: ComponentInfo) -> object | None:
        """`info` built over its files (None: it cannot be, `from_pretrained` reads it; `read_whole` says why)."""
        from .loader import load_dtype

        if info.name not in self.tiers:
            return None
        built, why = build_from_files(info, load_dtype(info), self._keep_phase)
        if built is None:
            self.read_whole[info.name] = why
            return None
        self._built[info.name] = built
        return built.module

    def after_build(self, info: ComponentInfo, component: object) -> None:
        tier = self.tiers.get(info.name)
        if tier is None or not isinstance(component, torch.nn.Module):
            return
        built = self._built.pop(info.name, None)
        if built is not None and built.module is component:
            found = file_sources(info, component, tier, keep_phase=self._keep_phase, weights=built.weights)
            self.found[info.name] = found
            if built.mapped:  # off the files' mapping: it goes with its last view
                release_file_bytes(component, found.weights)
            return
        found = file_sources(info, component, tier, keep_phase=self._keep_phase)
        self.found[info.name] = found
        release_file_bytes(component, found.weights)

    def close(self) -> None:
        for found in self.found.values():
            found.weights.close()
        self.found.clear()
        for built in self._built.values():
            built.weights.close()
        self._built.clear()
