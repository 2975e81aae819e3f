"""What one request of a given size costs on a given device, measured once and cached.

The forecast's time and activation figures cannot come from headers and configs: they depend on
the device, the request size and the pipeline's code. The engine measures them on every request
(per-block compute from `offload.block_timing`, the allocator peak of each phase above the weights
present, the streamer's own copy rate) and keeps the latest profile per (model, device, size) in
the cache directory, so the next plan of the same size is instant and says "cached".

Activation terms are stored above the weights, so they hold for any policy:
    text_extra   = text-encoding peak - weights on the device before the call - the largest staged encoder
    denoise_extra = denoise peak - weights before the call
    decode_extra = decode peak - weights before the call - the VAE if it was staged
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from .cache_dir import cache_root

PROFILE_VERSION = 1


class RequestSize(BaseModel):
    """The request fields that change compute and activations (None: the pipeline's default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    height: int | None = None
    width: int | None = None
    frames: int | None = None
    max_sequence_length: int | None = None
    guidance: float | None = None  # with guidance, some pipelines run two forwards per step

    def label(self) -> str:
        hw = f"{self.width or '?'}x{self.height or '?'}" if self.height or self.width else "default size"
        return f"{self.frames}x{hw}" if self.frames else hw


class RequestProfile(BaseModel):
    """Measured costs of one request size on one device (JSON in the cache directory)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = PROFILE_VERSION
    model: str = Field(description="model directory, resolved")
    model_bytes: int
    device: str = Field(description="device name, e.g. 'NVIDIA H200' or 'cpu'")
    size: RequestSize
    block_compute_s: list[float] = Field(description="per DiT block (execution order), one forward")
    other_s: float = Field(description="per forward, outside the blocks (embeddings, scheduler step)")
    forwards_per_step: int
    text_extra_bytes: int | None = None
    denoise_extra_bytes: int | None = None
    decode_extra_bytes: int | None = None
    bandwidth_bytes_per_s: float | None = Field(None, description="the streamer's async copies, bytes / seconds")
    measured_at: str


def device_name(device: object) -> str:
    import torch

    dev = torch.device(device)  # type: ignore[arg-type]
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def profile_dir() -> Path:
    return cache_root() / "profiles"


def profile_path(model: Path, model_bytes: int, device: str, size: RequestSize) -> Path:
    key = json.dumps([PROFILE_VERSION, str(Path(model).resolve()), model_bytes, device, size.model_dump()],
                     sort_keys=True)
    return profile_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def load_profile(model: Path, model_bytes: int, device: str, size: RequestSize) -> RequestProfile | None:
    """The cached profile, or None (none yet, or unreadable: a profile is only ever a cache)."""
    path = profile_path(model, model_bytes, device, size)
    try:
        return RequestProfile.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def any_profile(model: Path, model_bytes: int, device: str) -> RequestProfile | None:
    """The newest cached profile of this model on this device at any size (to scale from)."""
    found: list[RequestProfile] = []
    root = profile_dir()
    if not root.is_dir():
        return None
    resolved = str(Path(model).resolve())
    for path in root.glob("*.json"):
        try:
            p = RequestProfile.model_validate_json(path.read_text())
        except (OSError, ValueError):
            continue
        if p.model == resolved and p.model_bytes == model_bytes and p.device == device:
            found.append(p)
    return max(found, key=lambda p: p.measured_at, default=None)


def save_profile(profile: RequestProfile) -> Path:
    """Write atomically (temp file in the same directory, then replace): a reader never sees half."""
    path = profile_path(Path(profile.model), profile.model_bytes, profile.device, profile.size)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".profile-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(profile.model_dump_json(indent=1))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def device_name_for_plan(device: str | None) -> str:
    """The profile key's device name without initialising CUDA (`plan` stays quick): NVML's name of
    the GPU `device` names (default GPU 0), or "cpu" when it is a CPU or no NVIDIA driver answers."""
    if device is not None and not device.startswith("cuda"):
        return "cpu"
    index = int(device.split(":")[1]) if device and ":" in device else 0
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no GPU, no library: a CPU plan
        return "cpu"
    return name.decode() if isinstance(name, bytes) else str(name)
