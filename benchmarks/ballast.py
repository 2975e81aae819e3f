"""A card of N GB on a large GPU: another process holds all but N GB of the device until told to stop.

The process under test then sees what it would see on an N GB card where nothing else runs:
`cudaMemGetInfo` and NVML report about N GB free (their `total` stays the large GPU's, so a
budget must come from the free memory or the flag, never from the total). The ballast is a child
Python process: it starts CUDA, allocates 1 GiB blocks and then smaller ones until the device has
N GB free (its own CUDA context counted), prints one READY line with the free bytes it left, and
holds everything until a line arrives on its stdin (or stdin closes: the parent died). The parent
checks the free memory again through NVML (no CUDA context of its own) before it yields.

    from benchmarks.ballast import ballast
    with ballast(12) as card:          # cuda:0 now shows 12 GB free
        subprocess.run([... "omni-console", "run", ...])
    python3 -m benchmarks.ballast 12   # by hand: hold until Enter
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

GB = 10**9
TOLERANCE = 128 * 2**20  # the free memory left may differ from N GB by this much

_CHILD = r"""
import sys, torch
card, index, tol = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
dev = torch.device("cuda", index)
torch.cuda.init()
torch.empty(1, device=dev)  # the context exists before we measure
held = []
for chunk in (2**30, 2**26, 2**21):
    while True:
        free, _ = torch.cuda.mem_get_info(dev)
        if free - chunk < card:
            break
        held.append(torch.empty(chunk, dtype=torch.uint8, device=dev))
torch.cuda.synchronize(dev)
free, total = torch.cuda.mem_get_info(dev)
print(f"READY {free} {total} {sum(t.numel() for t in held)}", flush=True)
sys.stdin.readline()  # "stop", or EOF when the parent is gone
"""


@dataclass(frozen=True, slots=True)
class Card:
    """What the ballast left: free bytes as CUDA and NVML report them, the device's total, what it holds."""

    card_bytes: int
    free_cuda: int
    free_nvml: int | None
    total: int
    held: int
    pid: int


def nvml_free(index: int) -> int | None:
    """Free device bytes from NVML (no CUDA context is created); None without NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).free)
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return None


@contextlib.contextmanager
def ballast(card_gb: float, index: int = 0, tolerance: int = TOLERANCE) -> Iterator[Card]:
    """Hold all but `card_gb` GB (decimal) of GPU `index` in another process while the block runs.

    Raises RuntimeError when the device has less than that free, or the free memory it leaves is
    not within `tolerance` of the card (as CUDA and, when present, NVML report it)."""
    card = int(card_gb * GB)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(card), str(index), str(tolerance)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if not line or line[0] != "READY":
            raise RuntimeError(f"ballast for a {card_gb:g} GB card did not start (exit {proc.poll()})")
        free_cuda, total, held = (int(x) for x in line[1:4])
        free = nvml_free(index)
        for name, value in (("cudaMemGetInfo", free_cuda), ("NVML", free)):
            if value is not None and not card - tolerance <= value <= card + tolerance:
                raise RuntimeError(f"ballast: {name} shows {value / GB:.2f} GB free, not a {card_gb:g} GB card "
                                   f"(the device had less free to begin with, or another process changed it)")
        yield Card(card, free_cuda, free, total, held, proc.pid)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert proc.stdin is not None
                proc.stdin.write("stop\n")
                proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main() -> None:
    card_gb = float(sys.argv[1]) if len(sys.argv) > 1 else 24.0
    with ballast(card_gb) as card:
        print(f"a {card_gb:g} GB card: free {card.free_cuda / GB:.2f} GB (CUDA), "
              f"{(card.free_nvml or 0) / GB:.2f} GB (NVML); ballast pid {card.pid} holds {card.held / GB:.2f} GB. "
              "Enter stops it.", flush=True)
        sys.stdin.readline()


if __name__ == "__main__":
    main()
