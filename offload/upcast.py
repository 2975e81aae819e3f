"""fp8 storage, compute-dtype compute: each block's 8-bit weights upcast on the device before it runs.

Weights stored in float8 (an fp8 checkpoint read as stored, or a `--stream-dtype` cast at load) stay
8-bit in the host arena, on the link and in the ring's slot. Right before a streamed block runs, on
the compute stream, every float8 tensor of the block is converted into one compute-dtype scratch
buffer shared by all streamed blocks (blocks run one after another on that stream, so one buffer is
enough; the slot's next copy waits for compute, so it never overwrites bytes still being converted)
and re-pointed there. Resident blocks keep their fp8 bytes on the device as well and are converted
the same way by hooks of their own, right before they run (as diffusers' layerwise casting does), so
each costs fp8 device bytes and one upcast per forward, unless the plan keeps it upcast
(`BlockResidency.upcast`): then its float8 tensors are converted once when it becomes resident, the
same conversion, and its fp8 device copy is freed (twice the device bytes, no upcast per forward).
The DiT's non-block layers (small) are converted once where they land.

Why this is exact: every float8 value is representable in bfloat16, float16 and float32, so the
conversion is lossless, and a block computes with the very weights diffusers' layerwise casting
(`enable_layerwise_casting(storage_dtype=fp8, compute_dtype=...)`) upcasts layer by layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from .block_packing import Binding, Block, unique_tensors
from .devices import rebind, storage_key
from .module_hooks import Hooks
from .pinned import ALIGNMENT, align_up, contiguous_stride, typed_view
from .upcast_add import upcast_add

FLOAT8 = frozenset({torch.float8_e4m3fn, torch.float8_e5m2})


def is_float8(dtype: torch.dtype) -> bool:
    return dtype in FLOAT8


def _stored(b: Block) -> list[Binding]:
    return [x for x in b.bindings if is_float8(x.dtype)]


def upcast_bytes(b: Block, compute_dtype: torch.dtype) -> int:
    """Scratch bytes block `b` needs for its float8 tensors in `compute_dtype` (0: none stored in fp8)."""
    end = 0
    for x in _stored(b):
        end = align_up(end, ALIGNMENT) + _numel(x) * compute_dtype.itemsize
    return align_up(end, ALIGNMENT) if end else 0


class BlockUpcast:
    """The upcast step: float8 tensors of the block about to run, converted into one scratch buffer.

    Streamed blocks are converted from their slot by the ring (`run`); resident blocks keep their fp8
    bytes on the device too and are converted by hooks of their own (`hold`), their fp8 tensors put
    back after the forward: device bytes stay fp8, and each block pays the same upcast. A resident
    block named in `kept` (the streamer sets it from its residency) is converted once instead.
    """

    def __init__(self, compute_dtype: torch.dtype, device: torch.device) -> None:
        self.compute_dtype = compute_dtype
        self.device = device
        self._scratch: torch.Tensor | None = None
        self._held: dict[str, Hooks] = {}  # resident block → its hooks
        self.kept: frozenset[str] = frozenset()  # resident blocks to keep upcast (converted once)
        self._kept_bytes: dict[str, int] = {}  # a block kept upcast → its tensor bytes as stored (back at `drop`)
        # a merge on upload (offload/lora_merge.py) sets `addends` around a block's `run`: id of a weight → its
        # LoRA delta, added as the weight is upcast (offload/upcast_add.py); `fused`: the weights the last run did
        self.addends: dict[int, Callable[[], torch.Tensor]] | None = None
        self.fused: set[int] = set()

    @property
    def scratch_bytes(self) -> int:
        return self._scratch.numel() if self._scratch is not None else 0

    def size_for(self, blocks: Iterable[Block]) -> None:
        """Hold a scratch buffer for the largest streamed block's conversion (grown later if a resident
        block needs more)."""
        self._ensure(max((upcast_bytes(b, self.compute_dtype) for b in blocks), default=0))

    def _ensure(self, nbytes: int) -> torch.Tensor | None:
        if nbytes and (self._scratch is None or self._scratch.numel() < nbytes):
            self._scratch = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self._scratch

    def release(self) -> None:
        for hooks in self._held.values():
            hooks.remove()
        self._held.clear()
        self._kept_bytes.clear()
        self._scratch = None

    def run(self, b: Block, region: torch.Tensor) -> None:
        """Convert `b`'s float8 tensors (bytes in `region`, its slot) into the scratch and point them there."""
        stored = _stored(b)
        self.fused.clear()
        scratch = self._ensure(upcast_bytes(b, self.compute_dtype))
        if scratch is None:
            return
        addends = self.addends or {}
        at = 0
        for x in stored:
            at = align_up(at, ALIGNMENT)
            src = typed_view(region, x.offset, x.dtype, x.shape, x.stride)
            dst = typed_view(scratch, at, self.compute_dtype, x.shape, contiguous_stride(x.shape))
            addend = addends.get(id(x.target))
            if addend is None:
                dst.copy_(src)
            else:
                upcast_add(src, addend(), dst)
                self.fused.add(id(x.target))
            rebind(x.target, lambda dst=dst: dst)
            at += _numel(x) * self.compute_dtype.itemsize

    def keep(self, blocks: Iterable[Block], flags: Iterable[bool]) -> frozenset[str]:
        """Set `kept` to the blocks `flags` marks (a residency's `upcast_flags`); returns the names whose state
        changes (a resident one among them must be made resident again: `drop`, then `hold`)."""
        kept = frozenset(b.name for b, u in zip(blocks, flags, strict=True) if u)
        changed, self.kept = kept ^ self.kept, kept
        return changed

    def hold(self, b: Block) -> None:
        """A resident block: upcast its float8 tensors before each forward, put the fp8 ones back after; or,
        named in `kept`, converted once now (its fp8 device copy freed)."""
        name, module = b.name, b.module
        self.drop(b)
        tensors = unique_tensors(module)
        stored = [t for t in tensors if is_float8(t.dtype)]
        if not stored:
            return
        if name in self.kept:
            self._kept_bytes[name] = b.tensor_bytes
            fp8 = sum(t.nbytes for t in stored)
            shared = {storage_key(t) for t in stored}
            rest = [t for t in tensors if not is_float8(t.dtype) and storage_key(t) in shared]
            b.tensor_bytes += upcast_in_place(stored, self.compute_dtype) - fp8
            _own_copies(rest)  # off the storages the fp8 bytes were in, so that those are freed
            b.device_buffer = None  # the tensors own their converted copies now
            return
        need = 0
        for t in stored:
            need = align_up(need, ALIGNMENT) + t.numel() * self.compute_dtype.itemsize
        saved: list[torch.Tensor] = []

        def before(_module: torch.nn.Module, _args: Any) -> None:
            scratch = self._ensure(align_up(need, ALIGNMENT))
            assert scratch is not None
            saved[:] = [t.data for t in stored]
            at = 0
            for t, fp8 in zip(stored, saved, strict=True):
                at = align_up(at, ALIGNMENT)
                dst = typed_view(scratch, at, self.compute_dtype, tuple(fp8.shape), contiguous_stride(fp8.shape))
                dst.copy_(fp8)
                rebind(t, lambda dst=dst: dst)
                at += fp8.numel() * self.compute_dtype.itemsize

        def after(_module: torch.nn.Module, _args: Any, _output: Any) -> None:
            for t, fp8 in zip(stored, saved, strict=True):
                rebind(t, lambda fp8=fp8: fp8)
            saved.clear()

        hooks = self._held[name] = Hooks()
        hooks.before(module, before)
        hooks.after(module, after)

    def drop(self, b: Block) -> int:
        """A block no longer resident (or to be made resident again): its hooks go, its bytes as stored come
        back (its tensors are the streamer's again); returns the bytes of its kept-upcast copies (0: none)."""
        hooks = self._held.pop(b.name, None)
        if hooks is not None:
            hooks.remove()
        if b.name not in self._kept_bytes:
            return 0
        upcast, b.tensor_bytes = b.tensor_bytes, self._kept_bytes.pop(b.name)
        return upcast


def _own_copies(tensors: Iterable[torch.Tensor]) -> None:
    """Point each tensor at a copy of its own (aliases of one span share one copy): a kept block's tensors
    left in their dtype that shared a storage with its fp8 ones (the block's device copy, or a span moved
    whole) would otherwise keep that storage, fp8 bytes and all, allocated (measured on CUDA: a kept
    block held its compute-dtype bytes plus its fp8 ones)."""
    copies: dict[tuple[Any, ...], torch.Tensor] = {}
    for t in tensors:
        key = (storage_key(t), t.storage_offset(), t.dtype, tuple(t.shape), t.stride())

        def own(t: torch.Tensor = t, key: tuple[Any, ...] = key) -> torch.Tensor:
            if key not in copies:
                copies[key] = t.detach().clone()
            return copies[key]

        rebind(t, own)


def upcast_in_place(tensors: Iterable[torch.Tensor], compute_dtype: torch.dtype) -> int:
    """Re-point each float8 tensor at a `compute_dtype` copy on its device (resident weights: converted
    once); returns the compute-dtype bytes made. Aliases of one storage are converted separately."""
    made = 0
    for t in tensors:
        if is_float8(t.dtype):
            up = t.detach().to(compute_dtype)
            rebind(t, lambda up=up: up)
            made += up.numel() * up.element_size()
    return made


def module_upcast(module: torch.nn.Module, compute_dtype: torch.dtype) -> int:
    """`upcast_in_place` over a module's parameters and buffers."""
    return upcast_in_place([*module.parameters(), *module.buffers()], compute_dtype)


def _numel(x: Binding) -> int:
    n = 1
    for d in x.shape:
        n *= d
    return n
