"""Check a requested compute device before anything loads.

`torch.device` accepts names this engine cannot run on ("meta", "mps", "cpu:3") and says nothing
about whether a CUDA device exists; a bad `--device` found only when the first tensor moves would
cost the operator a whole load. Each refusal is one line naming the flag and what would work.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError

SUPPORTED = "cpu, cuda or cuda:N"


def parse_device(text: str | None, flag: str = "--device") -> torch.device | None:
    """The device named by `text` (None: let the engine choose), or ConfigError with one line."""
    if text is None:
        return None
    try:
        device = torch.device(text)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"{flag} {text!r}: not a device name (use {SUPPORTED})") from None
    if device.type == "cpu":
        if device.index not in (None, 0):
            raise ConfigError(f"{flag} {text!r}: there is one CPU device (use cpu)")
        return device
    if device.type != "cuda":
        raise ConfigError(f"{flag} {text!r}: {device.type} devices are not supported (use {SUPPORTED})")
    if not torch.cuda.is_available():
        raise ConfigError(f"{flag} {text!r}: CUDA is not available on this machine (use --device cpu)")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        devices = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
        raise ConfigError(f"{flag} {text!r}: this machine has {count} CUDA device{'s' * (count != 1)} ({devices})")
    return device
