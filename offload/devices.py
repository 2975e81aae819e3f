"""Device helpers shared by the streamer and the stager: streams, syncs, storage re-pointing.

Everything here works for device "cpu" (no streams; copies are plain synchronous copies) and for
CUDA devices (copy streams, events). Keeping the branch in one place keeps the runtime readable.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch


def as_device(device: torch.device | str) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def current_stream(device: torch.device) -> Any:
    """The stream compute is issued on (None on CPU)."""
    return torch.cuda.current_stream(device) if is_cuda(device) else None


def new_stream(device: torch.device, priority: int = 0) -> Any:
    """A CUDA stream (None on a CPU); a negative `priority` is scheduled ahead of priority-0 streams."""
    return torch.cuda.Stream(device=device, priority=priority) if is_cuda(device) else None


def stream_context(stream: Any) -> Any:
    return torch.cuda.stream(stream) if stream is not None else nullcontext()


def synchronize(device: torch.device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)


def empty_cache(device: torch.device) -> None:
    if is_cuda(device):
        torch.cuda.empty_cache()


def placeholder(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero-element stand-in: the tensor keeps its dtype and device but holds no memory."""
    return torch.empty(0, dtype=dtype, device=device)


def rebind(target: torch.Tensor, make_value: Any) -> None:
    """Point `target` (a Parameter or buffer) at new storage without changing its identity.

    `make_value()` builds the new tensor inside an inference-mode guard that matches the target:
    a view made inside `torch.inference_mode()` would otherwise be an inference tensor and silently
    turn the parameter into one (it would then fail outside inference mode).
    """
    with torch.inference_mode(target.is_inference()):
        target.data = make_value()


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A uint8 view of the whole untyped storage under `t` (same device)."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (storage.nbytes(),), (1,))


def storage_key(t: torch.Tensor) -> tuple[str, int | None, int, int]:
    """Identifies the physical storage under `t` (views and tied tensors share a key)."""
    storage = t.untyped_storage()
    ptr = storage.data_ptr()
    if storage.nbytes() == 0 or ptr == 0:
        return ("empty", None, id(t), 0)  # zero-byte storages never alias anything
    return (t.device.type, t.device.index, ptr, storage.nbytes())


def unview_buffers(module: torch.nn.Module,
                   replaced_by: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> int:
    """Replace buffers that are autograd views by equal non-view tensors over the same storage.

    A view keeps its base tensor alive, and re-pointing the view's `.data` does not drop that
    base: the original host storage would survive next to our host copy. Parameters are never
    views, so their identities are untouched; view buffers get a new (aliasing) tensor object,
    which `replaced_by(old, new)` is told of (a buffer still waiting for its file bytes is known
    by identity: `DeferredWeights.replace`). Returns how many buffers were replaced.
    """
    replaced = 0
    for sub in module.modules():
        for name, buf in list(sub._buffers.items()):
            if buf is None or not buf._is_view() or isinstance(buf, torch.nn.Parameter):
                continue
            fresh = torch.empty(0, dtype=buf.dtype, device=buf.device)
            with torch.no_grad():
                fresh.set_(buf.untyped_storage(), buf.storage_offset(), buf.shape, buf.stride())
            fresh.requires_grad_(buf.requires_grad)
            sub._buffers[name] = fresh
            if replaced_by is not None:
                replaced_by(buf, fresh)
            replaced += 1
    return replaced


def move_preserving_aliases(tensors: list[torch.Tensor], device: torch.device) -> int:
    """Move tensors to `device` in place (`.data` re-pointed), one copy per shared storage.

    `Module.to()` copies every tensor separately, so a buffer that views a weight, or two
    Parameters over one storage, stop sharing memory. Here each storage's used byte span is copied
    once and every tensor gets a view with its own offset, shape and stride. Returns bytes copied.
    """
    from .pinned import span_elements, typed_view  # local: pinned imports nothing from here

    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        if t.device == device:
            continue
        if t.numel() == 0:
            rebind(t, lambda t=t: t.detach().to(device))
            continue
        groups.setdefault(storage_key(t), []).append(t)
    moved = 0
    for ts in groups.values():
        starts = [t.storage_offset() * t.element_size() for t in ts]
        ends = [s + span_elements(t.shape, t.stride()) * t.element_size() for s, t in zip(starts, ts, strict=True)]
        lo = min(starts) // 16 * 16
        hi = max(ends)
        dev = torch.empty(hi - lo, dtype=torch.uint8, device=device)
        dev.copy_(storage_bytes(ts[0])[lo:hi])
        for t, start in zip(ts, starts, strict=True):
            shape, stride = tuple(t.shape), tuple(t.stride())
            rebind(t, lambda t=t, d=dev, o=start - lo, sh=shape, st=stride: typed_view(d, o, t.dtype, sh, st))
        moved += hi - lo
    return moved
