"""fp8 upcast and a LoRA merge in one pass: `out = float8 weight + delta`, rounded once, as the two steps round.

A streamed fp8 block with a merged LoRA was upcast into the scratch (read 1 byte, write 2 per weight) and then
merged (`weight += delta`: read 2, read 2, write 2). Fused, the weight is read once in fp8 and written once:
5 bytes instead of 9, on the compute stream, in a step that fp8 storage has made compute-bound.

Why the bits are the same: the upcast is exact (every float8 value is a bfloat16, float16 and float32 value),
and PyTorch's in-place add of 16-bit tensors computes in float32 and rounds once to nearest-even, which is what
the kernel does. The first weight of each combination of dtypes is also done the two-step way and compared bit
for bit (once per process, one synchronisation); a difference turns the kernel off for good. Where the kernel
cannot run (no Triton, a CPU, a card below compute capability 8.9, a non-contiguous or unusual operand), the two
steps run as before. So do a 16-bit delta of the other 16-bit type than `out`: on an H100 (2026-12-07, the cuda
tests), a bfloat16 delta too small for float16 added to a zero weight gave -0.0 in PyTorch's in-place add and
+0.0 in the kernel (56 of 2047 values; every one a negative sum that rounds to zero).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import torch

_ROUNDED = frozenset({torch.bfloat16, torch.float16})  # the kernel rounds its float32 sum into one of these
_kernel: Any = None
_broken = False  # the kernel failed or rounded otherwise once: the two steps from then on
_checked: set[tuple[torch.dtype, torch.dtype, torch.dtype]] = set()  # dtypes whose first fused weight matched


def upcast_add(src: torch.Tensor, delta: torch.Tensor, out: torch.Tensor) -> bool:
    """Write `src` (float8) upcast plus `delta` into `out`: the bits of `out.copy_(src); out += delta`. Returns
    whether the fused kernel did it."""
    global _broken
    if _fusable(src, delta, out):
        try:
            _launch(src, delta, out)
        except Exception:  # noqa: BLE001 - a Triton that cannot build the kernel here: the two steps instead
            _broken = True
        else:
            kinds = (src.dtype, delta.dtype, out.dtype)
            if kinds in _checked:
                return True
            if _same_bits(out, _two_steps(src, delta, torch.empty_like(out))):
                _checked.add(kinds)
                return True
            _broken = True  # this card or Triton rounds otherwise: never again in this process
    _two_steps(src, delta, out)
    return False


def kernel_in_use() -> bool:
    """The fused kernel has run and passed its check in this process (a benchmark's report says which path ran)."""
    return _kernel is not None and not _broken


def _two_steps(src: torch.Tensor, delta: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    out.copy_(src)
    out += delta
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))


def _fusable(src: torch.Tensor, delta: torch.Tensor, out: torch.Tensor) -> bool:
    if _broken or not out.is_cuda or not dtypes_fuse(src.dtype, delta.dtype, out.dtype):
        return False
    if src.shape != out.shape or delta.shape != out.shape:
        return False
    if not (src.is_contiguous() and delta.is_contiguous() and out.is_contiguous()):
        return False
    if delta.device != out.device or src.device != out.device:
        return False
    return _kernel_can_run(out.device.index if out.device.index is not None else torch.cuda.current_device())


def dtypes_fuse(src: torch.dtype, delta: torch.dtype, out: torch.dtype) -> bool:
    """Whether the kernel gives the two steps' bits for these dtypes: float8 in, a 16-bit `out`, and a delta of
    `out`'s own type or float32 (a bfloat16 delta added in place to float16 rounds otherwise on CUDA)."""
    float8 = src.is_floating_point and src.itemsize == 1
    return float8 and out in _ROUNDED and delta in (out, torch.float32)


@functools.cache
def _kernel_can_run(device_index: int) -> bool:
    """Triton is installed and converts float8 on this card (sm_89 on): asked once per card, not per weight."""
    if torch.cuda.get_device_capability(device_index) < (8, 9):
        return False
    return importlib.util.find_spec("triton") is not None


def _launch(src: torch.Tensor, delta: torch.Tensor, out: torch.Tensor) -> None:
    global _kernel
    if _kernel is None:
        _kernel = _build()
    n = out.numel()
    block = 2048
    _kernel[((n + block - 1) // block,)](src, delta, out, n, BLOCK=block)


def _build() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def upcast_add_kernel(src_ptr, delta_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        weight = tl.load(src_ptr + offsets, mask=mask).to(tl.float32)
        update = tl.load(delta_ptr + offsets, mask=mask).to(tl.float32)
        tl.store(out_ptr + offsets, (weight + update).to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
                 mask=mask)

    return upcast_add_kernel
