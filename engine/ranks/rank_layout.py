"""How many GPUs (ranks) serve one model, how they share its blocks, and what they run in parallel.

Spelled as vLLM-Omni spells it: `--gpus N`, `--dlo-use-allgather` (default with N > 1: each rank
pins 1/N of every streamed block and the ranks all-gather it before it runs) or
`--dlo-no-use-allgather` (every rank streams whole blocks from its own pinned copy). `parallel` says
what the ranks do at once: `dp`, data-parallel replicas (N prompts or seeds per request), or `cfg`,
the conditional and unconditional branches of one guided request on two ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..running.runner import GenerateRequest

Parallel = Literal["dp", "cfg"]
MAX_GPUS = 64


@dataclass(frozen=True, slots=True)
class RankLayout:
    gpus: int = 1
    allgather: bool = True
    parallel: Parallel = "dp"

    @property
    def distributed(self) -> bool:
        return self.gpus > 1

    @property
    def sharded(self) -> bool:
        """Blocks are sharded across the ranks (AllGather with more than one rank)."""
        return self.allgather and self.gpus > 1

    def rank_requests(self, request: GenerateRequest) -> list[GenerateRequest]:
        """What each rank runs, by rank: data-parallel, `request` with the seeds `seed … seed+N−1` (N images
        of one prompt at once); CFG-parallel, `request` itself on both ranks (one image). The one home of
        this rule: `GroupEngine` runs these and `run --gpus` names each rank's output by them."""
        if self.parallel == "cfg":
            return [request] * self.gpus
        return [replace(request, seed=request.seed + r) for r in range(self.gpus)]

    def describe(self) -> str:
        """One line for the plan: what each rank holds and what the ranks run at once."""
        if not self.distributed:
            return "1 GPU"
        what = (f"data-parallel: {self.gpus} replicas run {self.gpus} prompts or seeds at once"
                if self.parallel == "dp" else
                "CFG-parallel: the conditional and unconditional branches run on different ranks")
        how = (f"AllGather: each rank pins 1/{self.gpus} of every streamed block and gathers it over NVLink"
               if self.allgather else "rank-local: each rank streams whole blocks from its own pinned copy")
        return f"{self.gpus} GPUs · {what} · {how}"


def rank_layout(gpus: int | None, allgather: bool | None, parallel: str | None) -> RankLayout:
    """Check the flags (ConfigError, one line, before anything loads) and build the layout."""
    n = 1 if gpus is None else gpus
    if not 1 <= n <= MAX_GPUS:
        raise ConfigError(f"--gpus must be between 1 and {MAX_GPUS}, got {n}")
    mode = parallel or "dp"
    if mode not in ("dp", "cfg"):
        raise ConfigError(f"--parallel must be dp or cfg, got {mode!r}")
    if mode == "cfg" and n != 2:
        raise ConfigError(f"--parallel cfg runs the two guidance branches on two ranks: it needs --gpus 2, got {n}")
    return RankLayout(n, True if allgather is None else allgather, mode)  # type: ignore[arg-type]


def check_layout_device(layout: RankLayout, device_type: str) -> None:
    """Enough devices for the ranks (ConfigError, one line): GPUs on CUDA, cores for gloo ranks on a CPU."""
    if not layout.distributed:
        return
    if device_type == "cuda":
        import torch

        have = torch.cuda.device_count()
        if layout.gpus > have:
            raise ConfigError(f"--gpus {layout.gpus}: this machine has {have} CUDA device{'s' if have != 1 else ''}")
    else:
        import os

        have = os.cpu_count() or 1
        if layout.gpus > have:
            raise ConfigError(f"--gpus {layout.gpus}: on a CPU each rank is a process; this machine has {have} cores")
