"""Build a page-cache/disk-tier staged component without ever holding its weights in host memory.

A staged encoder/VAE in a file tier keeps no host master: its stager reads its tensors from their files at each
stage (offload/file_stager.py). Built by its library's `from_pretrained`, the component was read whole into host
memory once, then gave those bytes back (engine/loading/file_sources.py): a 9.8 GB T5-XXL made a 16 GB host's load
peak at 20.8 GB. Here it is built with its weights still in their files:

- a diffusers model as `engine.loading.direct_load` builds a DiT: parameters on meta, then an empty (allocated,
  never written) host tensor per state-dict tensor, each with the `Source` of its bytes. Exact by construction:
  names and shapes match one for one and the read converts as diffusers' load does;
- a transformers model by transformers itself, over a state dict of views of a private, read-only use mapping of
  its files (`mmap`): its loader, key conversions and dtype rules run unchanged, and a tensor it uses in place (the
  load dtype) *is* a file range, so that range is its source by construction, with nothing read. A tensor it
  converted, renamed into a copy or computed is matched by name against the files' bytes as file_sources.py
  matches (its pages are read for that check and the conversion), else it stays a small host copy.

Whatever the library reads of the mapping is file-backed page cache the kernel can drop, not the process's
memory; the mapping goes with the last view of it (the stager re-points every tensor to its placeholder). A
component neither path can build (a quantized one, a class with its own `from_pretrained`) is read by
`from_pretrained` as before (engine/planning/host_forecast.py `built_from_files` says which, for the load phase).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any

import torch

from ...offload.deferred_weights import DeferredWeights, Source
from ..model_dir.discovery import ComponentInfo
from .arena_load import build_over_state, supports_arena_load
from .direct_load import StoredTensor, build_deferred, component_locations, open_fd


@dataclass(frozen=True, slots=True)
class FileBuilt:
    """A component built with its weights in their files: `weights` knows the source of each tensor it matched
    by construction; `mapped` (transformers) says which model tensors still view the files' mapping."""

    module: torch.nn.Module
    weights: DeferredWeights
    mapped: bool


def build_from_files(info: ComponentInfo, dtype: torch.dtype | None, keep_phase: bool) -> tuple[FileBuilt | None, str]:
    """The component built without reading its weights (module docstring), or (None, why not)."""
    if info.library == "diffusers":
        weights = DeferredWeights(1, keep_phase=keep_phase)
        module, why = build_deferred(info, dtype, weights)
        if module is None:
            weights.close()
            return None, why
        return FileBuilt(module, weights, mapped=False), ""
    why = supports_arena_load(info)
    if why is not None:
        return None, why
    return _build_mapped(info, dtype, keep_phase)


def _build_mapped(info: ComponentInfo, dtype: torch.dtype | None, keep_phase: bool) -> tuple[FileBuilt | None, str]:
    from ..model_dir.trusted_classes import component_class

    cls = component_class(info.library, info.class_name, str(info.folder))
    stored = component_locations(info)
    weights = DeferredWeights(1, keep_phase=keep_phase)
    try:
        maps = _mappings(info, weights)
        state: dict[str, torch.Tensor] = {}
        for key, found in stored.items():
            view = _view(maps[found.file][1], found)
            if view is None:
                weights.close()
                return None, f"{key!r:.80} is not aligned to its dtype in its file"
            state[key] = view
        model = build_over_state(cls, info, state, dtype)
        del state
        model.config.name_or_path = str(info.folder)
        model.eval()  # requires_grad left as transformers leaves it: exactness (see loader.load_component)
        for t in _distinct(model):
            source = _mapped_source(t, maps)
            if source is not None:
                weights.add(t, source)
    except BaseException:
        weights.close()
        raise
    return FileBuilt(model, weights, mapped=True), ""


def _mappings(info: ComponentInfo, weights: DeferredWeights) -> dict[Any, tuple[int, torch.Tensor]]:
    """Each weight file: its descriptor (owned by `weights`) and a uint8 tensor over a private mapping of it
    (read-only use: copy-on-write, so a library writing a tensor in place never reaches the file)."""
    out: dict[Any, tuple[int, torch.Tensor]] = {}
    for file in info.files:
        fd = open_fd(file)
        weights.own_fd(fd)
        size = os.fstat(fd).st_size
        if size == 0:
            continue
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        out[file] = (fd, torch.frombuffer(mapping, dtype=torch.uint8))
    return out


def _view(base: torch.Tensor, found: StoredTensor) -> torch.Tensor | None:
    """`found`'s bytes in the mapping as its dtype and shape (None: not aligned to the dtype)."""
    if found.offset % found.dtype.itemsize:
        return None
    return base[found.offset : found.offset + found.nbytes].view(found.dtype).reshape(found.shape)


def _distinct(module: torch.nn.Module) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for t in [*module.parameters(), *module.buffers()]:
        seen.setdefault(id(t), t)
    return list(seen.values())


def _mapped_source(t: torch.Tensor, maps: dict[Any, tuple[int, torch.Tensor]]) -> Source | None:
    """The file range `t` is a view of, exactly (contiguous, in the mapping), else None."""
    if t.device.type != "cpu" or t.is_meta or not t.is_contiguous() or t.numel() == 0:
        return None
    ptr, n = t.data_ptr(), t.numel() * t.element_size()
    for fd, base in maps.values():
        lo = base.data_ptr()
        if lo <= ptr and ptr + n <= lo + base.numel():
            return Source(fd, ptr - lo, n, t.dtype, tuple(t.shape))
    return None

