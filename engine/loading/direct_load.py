"""Build a diffusers model with its weights still in their files, to be read straight into place.

`from_pretrained` reads every tensor into a host tensor of its own, one thread at a time; the
streamer then copies each block into its arena. Here the model is built exactly as diffusers builds
it (same config, same default dtype, parameters on `meta`, buffers computed), and each weight gets
a `Source` (file, byte range, stored dtype) from the safetensors header: the streamer reads blocks
into the arena in parallel and nothing holds a second copy (`offload.deferred_weights`).

Only what this path reproduces exactly is taken; anything else keeps `from_pretrained` and says why:
a diffusers `ModelMixin` subclass (not `AutoModel`), no quantization config, and a checkpoint whose
tensor names and shapes match the model's state dict one for one (the old attention-block names
diffusers renames on load, for instance, do not). The dtype rule is diffusers' own: floating tensors
in the load dtype, modules listed in `_keep_in_fp32_modules` in float32, others as stored.

Files are opened with the same checks as every other read (regular files inside the folder).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...offload.address_phase import empty_at_phase, phase_of
from ...offload.deferred_weights import DeferredWeights, Source
from ...offload.pinned import HostArena, arena_views
from ..model_dir.discovery import ComponentInfo
from ..model_dir.safe_paths import open_regular
from ..model_dir.trusted_classes import component_class
from ..model_dir.weights import DTYPES, ModelDirError
from .construction_lock import MODEL_CONSTRUCTION

MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit


@dataclass(frozen=True, slots=True)
class StoredTensor:
    file: Path
    offset: int  # from the start of the file
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def read_locations(path: Path) -> dict[str, StoredTensor]:
    """Every tensor's byte range in one safetensors file, checked against the file's size."""
    with open_regular(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise ModelDirError(f"{path}: not a safetensors file (shorter than its header)")
        (n,) = struct.unpack("<Q", prefix)
        if n > min(MAX_HEADER_BYTES, size - 8):
            raise ModelDirError(f"{path}: corrupt safetensors header (length {n})")
        try:
            header = json.loads(handle.read(n))
        except (ValueError, RecursionError):
            raise ModelDirError(f"{path}: corrupt safetensors header (not JSON)") from None
    if not isinstance(header, dict):
        raise ModelDirError(f"{path}: corrupt safetensors header (not an object)")
    base, data_bytes = 8 + n, size - 8 - n
    out: dict[str, StoredTensor] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _stored(path, name, entry, base, data_bytes)
    return out


def _stored(path: Path, name: str, entry: Any, base: int, data_bytes: int) -> StoredTensor:
    try:
        tag, shape, (begin, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
        begin, end = int(begin), int(end)
    except (KeyError, TypeError, ValueError):
        raise ModelDirError(f"{path}: corrupt safetensors header entry {name!r:.80}") from None
    if tag not in DTYPES or not hasattr(torch, DTYPES[tag][0]):
        raise ModelDirError(f"{path}: tensor {name!r:.80} has unsupported dtype {tag!r:.20}")
    dtype = getattr(torch, DTYPES[tag][0])
    numel = 1
    for d in shape:
        if d < 0:
            raise ModelDirError(f"{path}: tensor {name!r:.80} has a negative dimension")
        numel *= d
    if not 0 <= begin <= end <= data_bytes or end - begin != numel * dtype.itemsize:
        raise ModelDirError(f"{path}: tensor {name!r:.80} lies outside the file or has the wrong size")
    return StoredTensor(path, base + begin, end - begin, dtype, shape)


def component_locations(info: ComponentInfo) -> dict[str, StoredTensor]:
    """Every tensor of a component's weight files, by name."""
    stored: dict[str, StoredTensor] = {}
    for file in info.files:
        stored.update(read_locations(file))
    return stored


def add_sources(weights: DeferredWeights, targets: Iterable[tuple[torch.Tensor, StoredTensor]]) -> None:
    """Give each tensor its stored range in `weights`, opening each file once (`weights` closes them)."""
    fds: dict[Path, int] = {}
    for tensor, found in targets:
        if found.file not in fds:
            fds[found.file] = open_fd(found.file)
            weights.own_fd(fds[found.file])
        weights.add(tensor, Source(fds[found.file], found.offset, found.nbytes, found.dtype, found.shape))


def _direct_class(info: ComponentInfo) -> tuple[type | None, str]:
    """The diffusers model class to build `info` with, or (None, why it cannot be read straight into place)."""
    if info.library != "diffusers" or not info.files:
        return None, "not a diffusers model with safetensors files"
    import diffusers

    cls = component_class(info.library, info.class_name, str(info.folder))
    if not (isinstance(cls, type) and issubclass(cls, diffusers.ModelMixin)) or cls is getattr(diffusers, "AutoModel",
                                                                                                   None):
        return None, f"{info.class_name} is not a diffusers model class"
    return cls, ""


def build_deferred(info: ComponentInfo, dtype: torch.dtype | None, weights: DeferredWeights
                   ) -> tuple[torch.nn.Module | None, str]:
    """The model with every state-dict tensor an empty host tensor whose source is registered in
    `weights`; (None, why) when this checkpoint needs `from_pretrained`'s own handling."""
    model, why, _ = _build_deferred(info, dtype, weights, in_arena=False)
    return model, why


def build_deferred_in_arena(info: ComponentInfo, dtype: torch.dtype | None, weights: DeferredWeights,
                            huge_pages: bool = True) -> tuple[torch.nn.Module | None, str, HostArena | None]:
    """As `build_deferred`, every weight a view into one host arena (returned, not page-locked): read
    in place, that arena is a staged encoder's or VAE's master as it is, so placement neither copies
    the component into a master of its own nor page-locks it at the end of the load (CUDA only: see
    `engine.loading.arena_load`). `huge_pages`: `LoadOptions.use_huge_pages`."""
    return _build_deferred(info, dtype, weights, in_arena=True, huge_pages=huge_pages)


def _build_deferred(info: ComponentInfo, dtype: torch.dtype | None, weights: DeferredWeights, in_arena: bool,
                    huge_pages: bool = True) -> tuple[torch.nn.Module | None, str, HostArena | None]:
    cls, why = _direct_class(info)
    if cls is None:
        return None, why, None
    config, unused = cls.load_config(str(info.folder), return_unused_kwargs=True, local_files_only=True)
    if config.get("quantization_config") is not None:
        return None, "quantized checkpoint", None
    stored = component_locations(info)
    model = _build_empty(cls, config, unused, dtype)
    state = model.state_dict(keep_vars=True)
    for key, tensor in state.items():
        found = stored.get(key)
        if found is None:
            return None, f"the checkpoint has no {key!r:.80} (diffusers renames or fills it on load)", None
        if tuple(tensor.shape) != found.shape:
            return (None, f"{key!r:.80} is {list(found.shape)} in the checkpoint, {list(tensor.shape)} in the model",
                    None)
    keep_fp32 = list(getattr(cls, "_keep_in_fp32_modules", None) or [])
    empties, arena = _empty_host_tensors(model, state, stored, dtype, keep_fp32, in_arena, weights.keep_phase,
                                         huge_pages)
    try:
        add_sources(weights, ((empty, stored[key]) for key, empty in empties.items()))
    except BaseException:
        weights.close()
        if arena is not None:
            arena.close()
        raise
    model.register_to_config(_name_or_path=str(info.folder))
    model.eval()  # requires_grad left as from_pretrained leaves it: exactness (see loader.load_component)
    return model, "", arena


def _build_empty(cls: type, config: dict, unused: dict, dtype: torch.dtype | None) -> torch.nn.Module:
    """diffusers' own construction: init functions skipped, parameters on meta, default dtype = load dtype."""
    import accelerate
    from diffusers.models.modeling_utils import no_init_weights

    with MODEL_CONSTRUCTION:
        original = torch.get_default_dtype()
        try:
            if dtype is not None and dtype.is_floating_point:
                torch.set_default_dtype(dtype)
            with no_init_weights(), accelerate.init_empty_weights():
                return cls.from_config(config, **unused)
        finally:
            torch.set_default_dtype(original)


def _empty_host_tensors(model: torch.nn.Module, state: dict[str, torch.Tensor], stored: dict[str, StoredTensor],
                        dtype: torch.dtype | None, keep_fp32: list[str], in_arena: bool, keep_phase: bool,
                        huge_pages: bool = True) -> tuple[dict[str, torch.Tensor], HostArena | None]:
    """Put an empty (allocated, unwritten) host tensor of the load dtype in place of every state-dict
    tensor, keeping tied ones tied; returns one key per distinct new tensor, and with `in_arena` the
    arena they all view (each tensor at an aligned offset, in state-dict order). With `keep_phase` (a
    CPU device) each tensor read as stored sits at its file address modulo a page, as in the plain
    pipeline's mapping of the file (`offload.address_phase`)."""
    slots: list[tuple[dict[str, Any], str, int]] = []  # (module table, name, id of the tensor it held)
    wanted: dict[int, tuple[str, torch.dtype, bool]] = {}  # id -> (first key, load dtype, is a parameter)
    in_state = {id(t) for t in state.values()}
    for prefix, module in model.named_modules():
        for table in (module._parameters, module._buffers):
            for name, old in table.items():
                key = f"{prefix}.{name}" if prefix else name
                if old is None or id(old) not in in_state or key not in state:
                    continue
                if id(old) not in wanted:
                    found = stored[key]
                    wanted[id(old)] = key, _load_dtype(key, found.dtype, old.dtype, dtype, keep_fp32), \
                        table is module._parameters
                slots.append((table, name, id(old)))
    specs = [(stored[key].shape, want) for key, want, _ in wanted.values()]
    phases = [phase_of(stored[key].offset, want.itemsize) if keep_phase and want == stored[key].dtype else None
              for key, want, _ in wanted.values()]
    if in_arena:
        arena, datas = arena_views(specs, phases, huge_pages)
    else:
        arena, datas = None, [torch.empty(shape, dtype=d) if phase is None else empty_at_phase(shape, d, phase)
                              for (shape, d), phase in zip(specs, phases, strict=True)]
    replaced: dict[int, torch.Tensor] = {}
    first_key: dict[str, torch.Tensor] = {}
    for (old_id, (key, _, is_parameter)), data in zip(wanted.items(), datas, strict=True):
        replaced[old_id] = torch.nn.Parameter(data) if is_parameter else data
        first_key[key] = replaced[old_id]
    for table, name, old_id in slots:
        table[name] = replaced[old_id]
    return first_key, arena


def _load_dtype(key: str, stored: torch.dtype, in_model: torch.dtype, dtype: torch.dtype | None,
                keep_fp32: list[str]) -> torch.dtype:
    """The dtype `from_pretrained` gives this tensor (diffusers' `load_model_dict_into_meta`)."""
    if dtype is not None and stored.is_floating_point:
        return torch.float32 if any(m in key.split(".") for m in keep_fp32) else dtype
    return in_model if dtype is None else stored


def open_fd(path: Path) -> int:
    with open_regular(path) as handle:
        return os.dup(handle.fileno())
