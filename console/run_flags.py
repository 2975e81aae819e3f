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
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.errors import ConfigError
from .args import budget_from_args, policy_from_args, ram_budget_from_args

if TYPE_CHECKING:
    from ..engine.api import checks

DEMO_PIPELINE = "FluxPipeline"  # the embedded demo's pipeline (engine/demo/demo_model.py; a test holds it)
MAX_STEPS, MAX_FRAMES = 10_000, 4096  # engine.running.request_limits' (a test holds them equal)
SEED_MAX = 2**64 - 1  # engine.running.request_checks' (torch.Generator's unsigned 64-bit seed; a test holds it)
MIN_FPS, MAX_FPS = 0.01, 1000.0  # 100 s to 1 ms a frame: what MP4 time bases and GIF/WebP durations hold
_DEVICE = re.compile(r"([a-z]+)(?::(0|[1-9]\d{0,3}))?")  # as torch.device spells them (engine.loading.device_choice)
_TORCH_DEVICE_TYPES = frozenset({  # torch.device's error lists them (a test holds them equal)
    "cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga", "maia", "xla", "lazy",
    "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone"})


_GPU_DRIVER_NODES = ("/dev/nvidiactl", "/dev/kfd")  # NVIDIA's control device, ROCm's (torch.cuda on HIP)


def check_device_name(device: str | None) -> None:
    """`--device` without torch: its syntax, and on Linux a CUDA device where no GPU driver is present
    (neither device node: torch would find none), in the line `parse_device` gives after the import.
    Whether `cuda:N` exists where a driver is present needs torch: `run` checks it after the import."""
    if device is None:
        return
    named = _DEVICE.fullmatch(device)
    if named is None or named[1] not in _TORCH_DEVICE_TYPES:
        raise ConfigError(f"--device {device!r:.60}: not a device name (use cpu, cuda or cuda:N)")
    if named[1] == "cpu" and named[2] not in (None, "0"):
        raise ConfigError(f"--device {device!r}: there is one CPU device (use cpu)")
    if named[1] not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: {named[1]} devices are not supported (use cpu, cuda or cuda:N)")
    if named[1] == "cuda" and no_gpu_driver():
        raise ConfigError(f"--device {device!r}: CUDA is not available on this machine (use --device cpu)")


def no_gpu_driver() -> bool:
    """True only where it is certain: a Linux machine without an NVIDIA or ROCm device node."""
    return sys.platform.startswith("linux") and not any(os.path.exists(node) for node in _GPU_DRIVER_NODES)


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
    """`--steps` 1 to MAX_STEPS, `--frames` at most MAX_FRAMES, `--seed` in torch's range (the same lines
    `check_request` and `check_limits` give)."""
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps {args.steps}: must be at least 1")
    if args.steps is not None and args.steps > MAX_STEPS:
        raise ConfigError(f"--steps {args.steps}: at most {MAX_STEPS} steps")
    frames = getattr(args, "frames", None)
    if frames is not None and frames > MAX_FRAMES:
        raise ConfigError(f"--frames {frames}: at most {MAX_FRAMES} frames in one request")
    if not 0 <= args.seed <= SEED_MAX:
        raise ConfigError(f"--seed {args.seed}: must be between 0 and 2**64-1 ({SEED_MAX})")


def check_existing_output(args: argparse.Namespace) -> None:
    """An `--output` that exists, refused without --overwrite where the result is surely that file: an
    .mp4/.gif/.webp (always one file), or any suffix when the pipeline makes still images. A video's
    numbered frames are checked after the import, when its frame count is known."""
    from ..engine.api import checks, models

    if args.overwrite or not os.path.lexists(args.output):  # only the output itself is checked here
        return
    kind = checks.check_output(args.output, overwrite=True, frames=1).kind  # the suffix's kind; nothing refused yet
    still = None
    if kind == "still":
        name = DEMO_PIPELINE if args.model is None else pipeline_class_name(Path(args.model))
        still = models.makes_still_images(name) if name is not None else None
        if not still:
            return
    checks.check_output(args.output, overwrite=False, video=False if still else None, frames=1)


def pipeline_class_name(model: Path) -> str | None:
    """`model_index.json`'s `_class_name`, read alone (no weight headers: reading them imports numpy, 0.3 s);
    None where it cannot be read here (discovery says why, after)."""
    from ..engine.api import models

    try:
        name = models.load_json(model.expanduser() / "model_index.json").get("_class_name")
    except Exception:  # discovery reads it again and says why
        return None
    return name if isinstance(name, str) else None


@dataclass(frozen=True, slots=True)
class OptionFlags:
    """The request flags that need no model, parsed and checked."""

    params: dict[str, Any]
    fps: float | None
    cache: checks.CacheSpec | None = None  # --cache (None: off)


def parse_params(texts: Sequence[str]) -> dict[str, Any]:
    """`--param KEY=VALUE` flags → {key: typed value}; a key given twice is refused (which one would win?)."""
    from ..engine.api import checks

    params: dict[str, Any] = {}
    for text in texts:
        try:
            key, value = checks.parse_param(text)
        except ConfigError as exc:
            raise ConfigError(f"--param {exc}") from None
        if key in params:
            raise ConfigError(f"--param {key}: given twice")
        params[key] = value
    checks.check_finite(params, "--param")  # the line `check_call` gives after the import
    return params


def check_param_fps(params: dict[str, Any]) -> None:
    """Without --fps the video is written at the rate the request passes the pipeline (`frame_rate`, `fps`):
    the same bounds apply to it."""
    for key in ("frame_rate", "fps"):
        value = params.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and not (math.isfinite(value) and MIN_FPS <= value <= MAX_FPS):
            raise ConfigError(f"--param {key}={value:g}: the video is written at this rate, so it must be between "
                              f"{MIN_FPS:g} and {MAX_FPS:g} frames per second (or give --fps)")


def parse_option_flags(args: argparse.Namespace) -> OptionFlags:
    from ..engine.api import checks

    params, fps = parse_params(args.param or ()), check_fps(args.fps)
    if fps is None:
        check_param_fps(params)
    return OptionFlags(params, fps, checks.parse_cache(getattr(args, "cache", None)))


def precheck_run(args: argparse.Namespace) -> None:
    """Every `run` mistake the flags decide, then an existing output (see the module docstring)."""
    from ..engine.api import checks, planner, probes

    policy_from_args(args)
    budget_from_args(args)
    ram_budget_from_args(args)
    try:
        probes.validate_hz(args.telemetry_hz)
    except ValueError as exc:
        raise ConfigError(f"--telemetry-hz: {exc}") from None
    planner.rank_layout(args.gpus, args.dlo_use_allgather, args.parallel)  # the flags together; devices after import
    check_run_counts(args)
    check_device_name(args.device)  # its syntax; whether this machine has it needs torch (after the import)
    check_sizes(args)
    options = parse_option_flags(args)  # --param syntax and numbers, --fps
    checks.check_output_place(args.output)
    check_existing_output(args)
    if args.model is not None and options.params:  # a --param the pipeline's call has not (a typo)
        from ..engine.api import checks

        checks.check_parameter_names(args.model, options.params, "--param")
