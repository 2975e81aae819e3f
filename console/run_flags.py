"""The `run` and `plan` checks that need no model, on modules that import neither torch nor diffusers.

Importing torch and diffusers takes 5-8 s on a busy machine; a user who typed `--steps 0`, an unknown
suffix or an output that exists should hear so at once. `precheck_run` is called before `headless`
(which imports torch) and answers every mistake the flags alone decide, plus an existing output
wherever the pipeline's source settles which file the result is (`makes_still_images`). The later
checks on the imported pipeline run as before; these only answer first.
"""

from __future__ import annotations

import argparse
import math
import os
import re

from ..engine.errors import ConfigError
from .args import budget_from_args, policy_from_args, ram_budget_from_args

DEMO_PIPELINE = "FluxPipeline"  # the embedded demo's pipeline (engine/demo/demo_model.py; a test holds it)
SEED_MAX = 2**64 - 1  # engine.running.request_checks' (torch.Generator's unsigned 64-bit seed; a test holds it)
MIN_FPS, MAX_FPS = 0.01, 1000.0  # 100 s to 1 ms a frame: what MP4 time bases and GIF/WebP durations hold
_DEVICE = re.compile(r"cpu(:0)?|cuda(:\d{1,4})?")


def check_device_name(device: str | None) -> None:
    if device is not None and not _DEVICE.fullmatch(device):
        raise ConfigError(f"--device {device!r:.60}: not a device name (use cpu, cuda or cuda:N)")


def check_sizes(args: argparse.Namespace) -> None:
    """`--height`, `--width`, `--frames`, `--max-sequence-length` at least 1; `--guidance` finite (the lines
    `check_request` and `check_call` give, so `plan` and `run` say the same)."""
    for flag, what in (("--height", "a positive number of pixels"), ("--width", "a positive number of pixels"),
                       ("--frames", "at least 1"), ("--max-sequence-length", "at least 1")):
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value}: must be {what}")
    guidance = getattr(args, "guidance", None)
    if guidance is not None and not math.isfinite(guidance):
        raise ConfigError(f"--guidance {guidance}: must be a finite number")


def check_fps(fps: float | None) -> float | None:
    if fps is not None and not (math.isfinite(fps) and fps > 0):
        raise ConfigError(f"--fps {fps}: must be a positive finite number of frames per second")
    if fps is not None and not MIN_FPS <= fps <= MAX_FPS:
        raise ConfigError(f"--fps {fps:g}: must be between {MIN_FPS:g} and {MAX_FPS:g} frames per second")
    return fps


def check_run_counts(args: argparse.Namespace) -> None:
    """`--steps` at least 1, `--seed` in torch's range (the same lines `check_request` gives)."""
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps {args.steps}: must be at least 1")
    if not 0 <= args.seed <= SEED_MAX:
        raise ConfigError(f"--seed {args.seed}: must be between 0 and 2**64-1 ({SEED_MAX})")


def check_existing_output(args: argparse.Namespace) -> None:
    """An `--output` that exists, refused without --overwrite where the result is surely that file: an
    .mp4/.gif/.webp (always one file), or any suffix when the pipeline makes still images. A video's
    numbered frames are checked after the import, when its frame count is known."""
    from ..engine.api import check_output, discover_model, makes_still_images

    if args.overwrite or not os.path.lexists(args.output):  # only the output itself is checked here
        return
    kind = check_output(args.output, overwrite=True, frames=1).kind  # the suffix's kind; nothing refused yet
    still = None
    if kind == "still":
        name = DEMO_PIPELINE if args.model is None else discover_model(args.model, args.variant).pipeline_class
        still = makes_still_images(name)
        if not still:
            return
    check_output(args.output, overwrite=False, video=False if still else None, frames=1)


def precheck_run(args: argparse.Namespace) -> None:
    """Every `run` mistake the flags decide, then an existing output (see the module docstring)."""
    from ..engine.api import check_output_place, rank_layout, validate_hz

    policy_from_args(args)
    budget_from_args(args)
    ram_budget_from_args(args)
    try:
        validate_hz(args.telemetry_hz)
    except ValueError as exc:
        raise ConfigError(f"--telemetry-hz: {exc}") from None
    rank_layout(args.gpus, args.dlo_use_allgather, args.parallel)  # the flags together; the devices after import
    check_run_counts(args)  # (--device: torch names the devices, so it is checked after the import)
    check_sizes(args)
    check_fps(args.fps)
    check_output_place(args.output)
    check_existing_output(args)
