"""Small block models for the offload runtime tests (shared by the CPU and CUDA test files).

Each block mixes what real DiT blocks contain and what the streamer must keep exact: fp32 and bf16
weights inside one block, a tied weight, a buffer aliasing a weight's storage, a transposed
(non-contiguous but dense) weight used in a matmul, and a gappy strided weight.
"""

from __future__ import annotations

import torch
from torch import nn


class ToyBlock(nn.Module):
    def __init__(self, dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim, dtype=dtype)
        self.norm = nn.LayerNorm(dim)  # fp32 even in a bf16 block: mixed dtypes in one block
        self.proj = nn.Linear(dim, dim, bias=False, dtype=dtype)
        self.tied = nn.Linear(dim, dim, bias=False, dtype=dtype)
        self.tied.weight = self.proj.weight  # tied: one Parameter in two places
        self.wt = nn.Parameter(torch.randn(dim, dim, dtype=dtype).t())  # transposed, dense
        self.gap = nn.Parameter(torch.randn(dim, 2 * dim)[:, ::2])  # strided with gaps
        self.register_buffer("row", self.lin.weight.detach()[1])  # aliases lin.weight's storage
        self.aliased: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.lin.weight
        self.aliased.append(self.row.data_ptr() == w.data_ptr() + w.stride(0) * w.element_size())
        dtype = self.lin.weight.dtype
        h = self.lin(x.to(dtype)) + self.row
        h = self.norm(h.float())
        h = h + self.tied(self.proj(h.to(dtype))).float()
        h = h + (h.to(dtype) @ self.wt).float() * 0.5
        return h + self.gap[0]


class ToyModel(nn.Module):
    """Resident embed/out around two block lists (like Flux's double and single blocks)."""

    def __init__(self, n_blocks: int, dim: int = 64, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        n_a = (n_blocks + 1) // 2
        self.embed = nn.Linear(dim, dim)
        self.blocks_a = nn.ModuleList([ToyBlock(dim, torch.float32) for _ in range(n_a)])
        self.blocks_b = nn.ModuleList([ToyBlock(dim, torch.bfloat16) for _ in range(n_blocks - n_a)])
        self.out = nn.Linear(dim, dim)

    def all_blocks(self) -> list[ToyBlock]:
        return [*self.blocks_a, *self.blocks_b]

    def block_lists(self) -> list[tuple[str, list[nn.Module]]]:
        return [("blocks_a", list(self.blocks_a)), ("blocks_b", list(self.blocks_b))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.all_blocks():
            h = block(h)
        return self.out(h)


def block_tensor_bytes(block: nn.Module) -> int:
    """Bytes of a block's distinct weights (a buffer aliasing a weight is not counted twice)."""
    seen_ids: set[int] = set()
    storages: set[int] = set()
    total = 0
    for t in [*block.parameters(), *block.buffers()]:
        if id(t) in seen_ids:
            continue
        seen_ids.add(id(t))
        ptr = t.untyped_storage().data_ptr()
        if ptr in storages:
            continue
        storages.add(ptr)
        total += t.numel() * t.element_size()
    return total
