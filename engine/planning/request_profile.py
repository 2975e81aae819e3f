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
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..cache_dir import CacheFileError, cache_root, read_cache_file, write_cache_file

PROFILE_VERSION = 1
MAX_PROFILE_BYTES = 4 << 20  # 100,000 blocks' timings fit; a profile is never larger
MAX_BLOCKS = 100_000

# Bounds for what the cache may say: it is input too (a negative, NaN or infinite number would
# otherwise reach the forecast, the screen and `plan --json`).
Seconds = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]
Bytes = Annotated[int, Field(ge=0, le=1 << 60)]
Dim = Annotated[int, Field(ge=1, le=1 << 20)]


class _CachedSize(BaseModel):
    """A `RequestSize` as a profile file may state it (user flags are checked by the CLI, not here)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    height: Dim | None = None
    width: Dim | None = None
    frames: Dim | None = None
    max_sequence_length: Dim | None = None
    guidance: Annotated[float, Field(ge=-1e6, le=1e6, allow_inf_nan=False)] | None = None


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

    version: Literal[1] = PROFILE_VERSION
    model: str = Field(description="model directory, resolved", max_length=4096)
    model_bytes: Bytes
    device: str = Field(description="device name, e.g. 'NVIDIA H200' or 'cpu'", max_length=256)
    size: RequestSize
    block_compute_s: list[Seconds] = Field(description="per DiT block (execution order), one forward",
                                           max_length=MAX_BLOCKS)
    other_s: Seconds = Field(description="per forward, outside the blocks (embeddings, scheduler step)")
    forwards_per_step: int = Field(ge=1, le=16)
    text_extra_bytes: Bytes | None = None
    denoise_extra_bytes: Bytes | None = None
    decode_extra_bytes: Bytes | None = None
    allocator_slack_bytes: Bytes | None = Field(
        None, description="the caching allocator's reserved peak above its allocated peak (cache and "
                          "fragmentation; under a --vram-budget cap it fills what the cap leaves)")
    allocator_slack_plan: str | None = Field(
        None, max_length=64, description="a key of the plan that slack was measured under "
                                         "(engine/planning/slack_config.py): another plan's forecast uses the margin")
    bandwidth_bytes_per_s: Annotated[float, Field(gt=1.0, le=1e15, allow_inf_nan=False)] | None = Field(
        None, description="the streamer's async copies, bytes / seconds")
    host_peak_bytes: Bytes | None = Field(None, description="the process's measured peak RSS (VmHWM) by the "
                                          "request's end, load included")
    host_baseline_bytes: Bytes | None = Field(
        None, description="the process baseline that makes the host forecast meet host_peak_bytes "
                          "(engine/planning/host_profile.py): the next forecast of this model, device and size "
                          "uses it, under any plan")
    host_plan: str | None = Field(None, max_length=64, description="a key of the plan and load the host peak "
                                                                   "was measured under")
    measured_at: str = Field(max_length=64)


def device_name(device: object) -> str:
    import torch

    dev = torch.device(device)  # type: ignore[arg-type]
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def profile_dir() -> Path:
    return cache_root() / "profiles"


def _key_name(*key: object) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def profile_path(model: Path, model_bytes: int, device: str, size: RequestSize) -> Path:
    """The file of one (model, device, size): its name is a hash of that key, so a lookup opens one file."""
    name = _key_name(PROFILE_VERSION, str(Path(model).resolve()), model_bytes, device, size.model_dump())
    return profile_dir() / f"{name}.json"


def latest_path(model: Path, model_bytes: int, device: str) -> Path:
    """The copy of the newest profile of (model, device) at any size, the one a scaled forecast starts
    from: the index by file name that spares `plan` a scan of the folder (2,048 profiles took 14.6 s)."""
    return profile_dir() / f"latest-{_key_name(PROFILE_VERSION, str(Path(model).resolve()), model_bytes, device)}.json"


def read_profile(path: Path) -> RequestProfile | None:
    """One profile file: None when absent; `CacheFileError` (the reason) when it cannot be used.

    Regular files only, bounded in size (`read_cache_file`), and every number finite and in range.
    """
    raw = read_cache_file(path, MAX_PROFILE_BYTES)
    if raw is None:
        return None
    try:
        profile = RequestProfile.model_validate_json(raw)
        _CachedSize.model_validate(profile.size.model_dump())
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {}
        loc = tuple(first.get("loc", ()))
        if exc.title == _CachedSize.__name__:
            loc = ("size", *loc)
        where = ".".join(str(p) for p in loc) or "document"
        raise CacheFileError(f"is not a valid profile ({where}: {first.get('msg', 'invalid')})"[:200]) from None
    except (ValueError, RecursionError):
        raise CacheFileError("is not a valid profile") from None
    return profile


def _ignored(path: Path, reason: str) -> str:
    return f"cached profile {path} ignored: {reason}"


def load_profile(model: Path, model_bytes: int, device: str, size: RequestSize,
                 notes: list[str] | None = None) -> RequestProfile | None:
    """The cached profile, or None (none yet, or unusable: a profile is only ever a cache).

    An unusable one adds one line to `notes` saying which file and why."""
    path = profile_path(model, model_bytes, device, size)
    try:
        found = read_profile(path)
    except CacheFileError as exc:
        if notes is not None:
            notes.append(_ignored(path, str(exc)))
        return None
    if found is not None and (found.model, found.model_bytes, found.device, found.size) != (
            str(Path(model).resolve()), model_bytes, device, size):
        if notes is not None:  # a file name is only a claim (`latest_path`)
            notes.append(_ignored(path, "is another model's, device's or size's profile"))
        return None
    return found


def any_profile(model: Path, model_bytes: int, device: str,
                notes: list[str] | None = None) -> RequestProfile | None:
    """The newest cached profile of this model on this device at any size (to scale from).

    One file is read, `latest_path`'s, never the folder. Its name is only a claim: the file is
    validated like any profile and must state this model, its bytes and this device, else it is
    ignored with one note."""
    path = latest_path(model, model_bytes, device)
    try:
        found = read_profile(path)
    except CacheFileError as exc:
        if notes is not None:
            notes.append(_ignored(path, str(exc)))
        return None
    if found is None:
        return None
    if (found.model, found.model_bytes, found.device) != (str(Path(model).resolve()), model_bytes, device):
        if notes is not None:
            notes.append(_ignored(path, "is another model's or device's profile"))
        return None
    return found


def _write_atomically(path: Path, text: str) -> None:
    write_cache_file(path, text, ".profile-")


def save_profile(profile: RequestProfile) -> Path:
    """Write atomically (temp file in the same directory, then replace): a reader never sees half.
    The same profile is also this model's and device's newest (`latest_path`)."""
    path = profile_path(Path(profile.model), profile.model_bytes, profile.device, profile.size)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = profile.model_dump_json(indent=1)
    _write_atomically(path, text)
    _write_atomically(latest_path(Path(profile.model), profile.model_bytes, profile.device), text)
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
