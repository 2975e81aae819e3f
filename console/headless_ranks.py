"""`omni-console run --gpus N`: the flags a rank group refuses, before anything loads (ConfigError, one line).

The rest is `run`'s own path (`headless.run_headless`) over the engine's `service.run_ranks`: data-parallel
(`--parallel dp`) runs seeds `seed … seed+N−1`, one per rank, each image next to `--output` with its seed in
the name (`out.png` → `out-seed0.png`); CFG-parallel (`--parallel cfg`, two ranks) one image at `--output`.
A rank that fails or dies stops the group: one line, exit 1, every rank's memory gone with its process.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..engine.api import checks
from ..engine.errors import ConfigError

RAM_WITH_RANKS = ("--ram-budget with --gpus: the ranks share the host's memory, which the host plan does not split "
                  "yet; leave it out")


def check_rank_flags(args: argparse.Namespace, flags: Any, layout: Any) -> None:
    """`flags`: the checked `RunFlags` of `console.headless`; `layout`: its `RankLayout`."""
    if args.trace is not None:
        raise ConfigError("--trace with --gpus N > 1: a rank group's trace is not written yet (one GPU's is)")
    if getattr(args, "compile", "off") != "off":
        raise ConfigError("--compile with --gpus N > 1: the rank group does not compile yet (one GPU does)")
    if args.lora:
        raise ConfigError("--lora with --gpus N > 1: the rank group does not apply LoRAs yet (one GPU does)")
    if flags.budget is not None:
        raise ConfigError("--vram-budget with --gpus: plan one rank's budget with `plan --gpus`, then pass its policy")
    if flags.ram_budget is not None:
        raise ConfigError(RAM_WITH_RANKS)
    checks.check_cache_ranks(layout, flags.options.cache)  # only where each rank's cache decides as one GPU's would
