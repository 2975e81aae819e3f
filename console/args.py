"""Flag values shared by every subcommand: the model path and the offload policy.

Its own module so that `cli` (which dispatches), `app_main` and `headless` (which it dispatches to)
all import it without importing each other: the import graph inside console/ stays acyclic.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..engine.api import OffloadPolicy, RankLayout, planner

DEFAULT_RUN_PROMPT = "a lighthouse on a cliff at dusk"
"""`run`'s prompt when `--prompt` is left out (a pipeline that takes none gets none: DDPM, DiT)."""


def resolve_model_path(model: Path | None) -> Path:
    """`--model`, else the embedded demo model (built into the cache on first use)."""
    if model is not None:
        return model
    from ..engine.api import models

    return models.ensure_demo_model()


def policy_from_args(args: argparse.Namespace) -> OffloadPolicy:
    """The build-time-checked policy from `--dlo-offload-components`, `--resident-layers`, `--mode`,
    `--placement`, `--prefetch-slots`, `--stream-dtype`, `--fp8-modulation`, `--upcast-resident` and the lean phases
    (`--stream-encoders`, `--vae-tiling`, `--vae-slicing`, `--ff-chunking`)."""
    components = planner.parse_components_json(args.dlo_offload_components)
    return planner.build_policy(components, args.resident_layers, args.mode,
                        getattr(args, "placement", "leading"), getattr(args, "prefetch_slots", 2),
                        stream_dtype=getattr(args, "stream_dtype", None),
                        fp8_modulation=getattr(args, "fp8_modulation", False),
                        upcast_resident=getattr(args, "upcast_resident", "auto"),
                        **{name: getattr(args, name, "auto") or "auto" for name in planner.LEAN_FIELDS})


def budget_from_args(args: argparse.Namespace) -> int | None:
    """`--vram-budget` in bytes, or None (checked before anything loads: ConfigError, one line)."""
    text = getattr(args, "vram_budget", None)
    if text is None:
        return None
    return parse_budget(text, getattr(args, "device", None))


def ram_budget_from_args(args: argparse.Namespace) -> int | None:
    """`--ram-budget` in bytes, or None: a size (`size_arg.parse_size`'s rules and lines), or `auto`, the host
    memory available at start less a margin (`engine.planning.ram_budget`, its note the host plan's first line).
    Read once per command (kept on `args`): a later call, after torch's import, would count our own growth."""
    text = getattr(args, "ram_budget", None)
    if text is None:
        return None
    known = getattr(args, "ram_budget_bytes", None)
    if known is not None:
        return known
    if text.strip().lower() == "auto":
        from ..engine.api import planner

        value: int = planner.auto_ram_budget()
    else:
        from .size_arg import parse_size

        value = parse_size(text, "--ram-budget")
    args.ram_budget_bytes = value
    return value


def parse_budget(text: str, device: str | None, flag: str = "--vram-budget") -> int:
    """A size (`size_arg.parse_size`), or `auto`: what `device` has free now less a margin
    (`engine.planning.auto_budget`, its note the plan's first line); `auto` on a CPU is one line, exit 2."""
    if text.strip().lower() == "auto":
        from ..engine.api import planner

        return planner.auto_budget(device, f"{flag} auto")
    from .size_arg import parse_size

    return parse_size(text, flag)


def layout_from_args(args: argparse.Namespace) -> RankLayout:
    """`--gpus`, `--dlo-use-allgather` / `--dlo-no-use-allgather` and `--parallel`, checked against the flags
    and the devices `--device` (or its default) has, before anything loads (ConfigError, one line)."""
    from ..engine.api import planner

    layout = planner.rank_layout(getattr(args, "gpus", None), getattr(args, "dlo_use_allgather", None),
                         getattr(args, "parallel", None))
    planner.check_rank_devices(layout, getattr(args, "device", None))
    return layout
