"""The tiers' rates (`TierRates`) for a plan: measured once per (device, checkpoint's file system), then cached,
then learned from runs.

Torch-free. The link's rate is the one the engine already measures and keeps in the request profile; the page
cache's and O_DIRECT's are the I/O probe's (io_probe.py), kept in `<cache>/tier_rates/<hash>.json`. The cache is
untrusted input, read as profiles are (engine/cache_dir.py: regular files only, bounded, every number finite and
in range); a file that fails is ignored with one note and measured again. A rate nobody measured is said so
("unmeasured default", tier_cost.DEFAULT_RATES) in the plan's lines.

The probe reads 256 MiB its own way; a run's file tiers read gigabytes through the engine's reader
(offload/tier_filler.py). Measured on an H100 machine's disk, the probe's rate was 0.75-0.80 of the disk's and the
engine's reader 0.87-0.95 (docs/benchmarks.md, 2026-12-08), so a disk-bound plan's step floor was 1.26x the step.
After a request, the rate the run's reads reached over at least `LEARN_MIN_BYTES` of a tier replaces the cached
one (`learn_rates`), as the request profile learns the link's: the next plan's floor and tier choice use it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...offload.tiers import TierRates
from ..cache_dir import CacheFileError, cache_root, read_cache_file, write_cache_file
from .io_probe import ProbeResult, probe_rates

RATES_VERSION = 1
MAX_RATES_BYTES = 4096
Rate = Annotated[float, Field(gt=1.0, le=1e13, allow_inf_nan=False)]  # bytes/s: 10 TB/s is beyond any disk
LEARN_MIN_BYTES = 2**30  # a tier's reads in a run, at least, before their rate replaces the probe's
LEARNED_FIELDS = {"page_cache": "page_cache_bytes_per_s", "disk": "disk_bytes_per_s"}


class CachedRates(BaseModel):
    """One (device, file system)'s measured read rates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = RATES_VERSION
    device: str = Field(max_length=200)
    filesystem: str = Field(max_length=100)
    page_cache_bytes_per_s: Rate | None
    disk_bytes_per_s: Rate | None
    o_direct: bool
    note: str = Field(max_length=300)
    measured_at: str = Field(max_length=40)


def filesystem_key(model_dir: Path) -> str:
    """The file system a checkpoint lives on: its device number (the same disk, however it is mounted)."""
    st = os.stat(model_dir)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def rates_path(device: str, filesystem: str) -> Path:
    name = hashlib.sha256(json.dumps([RATES_VERSION, device, filesystem]).encode()).hexdigest()[:32]
    return cache_root() / "tier_rates" / f"{name}.json"


def load_rates(device: str, filesystem: str, notes: list[str] | None = None) -> CachedRates | None:
    """The cached rates, None when none are (or the file cannot be used: one line in `notes`)."""
    path = rates_path(device, filesystem)
    try:
        raw = read_cache_file(path, MAX_RATES_BYTES)
        if raw is None:
            return None
        found = CachedRates.model_validate_json(raw)
    except (CacheFileError, ValidationError, ValueError, RecursionError) as exc:
        reason = str(exc) if isinstance(exc, CacheFileError) else "is not a valid rates file"
        if notes is not None:
            notes.append(f"cached tier rates {path} ignored: {reason}"[:300])
        return None
    if (found.device, found.filesystem) != (device, filesystem):  # a file name is only a claim
        if notes is not None:
            notes.append(f"cached tier rates {path} ignored: another device's or file system's")
        return None
    return found


def save_rates(rates: CachedRates) -> Path:
    """Written atomically (a temp file beside it, then replaced)."""
    path = rates_path(rates.device, rates.filesystem)
    return write_cache_file(path, rates.model_dump_json(), ".rates-")


def _from_probe(device: str, filesystem: str, found: ProbeResult) -> CachedRates:
    return CachedRates(device=device, filesystem=filesystem, page_cache_bytes_per_s=found.page_cache,
                       disk_bytes_per_s=found.disk, o_direct=found.o_direct, note=found.note[:300],
                       measured_at=datetime.now(UTC).isoformat(timespec="seconds"))


def measured_rates(model_dir: Path, device: str, notes: list[str] | None = None, probe: bool = True,
                   files: Sequence[Path] = ()) -> CachedRates | None:
    """The cached rates of (device, model_dir's file system), else measured now on `files` (io_probe.probe_rates)
    and cached (`probe`), else None."""
    filesystem = filesystem_key(model_dir)
    found = load_rates(device, filesystem, notes)
    if found is not None or not probe:
        return found
    fresh = _from_probe(device, filesystem, probe_rates(model_dir, files))
    try:
        save_rates(fresh)
    except OSError as exc:  # a read-only cache: the rates hold for this run only
        if notes is not None:
            notes.append(f"tier rates not cached ({exc.strerror or exc})")
    return fresh


def tier_rates(cached: CachedRates | None, link: float | None, link_source: str = "measured"
               ) -> tuple[TierRates, dict[str, str]]:
    """The planner's `TierRates` and how each was obtained (the plan's lines say it)."""
    notes = {"pinned": link_source if link else "unmeasured default"}
    if cached is None:
        return TierRates(link, None, None), notes
    how = f"{'learned from a run' if cached.note.startswith('learned') else 'cached'} {cached.measured_at[:10]}"
    notes["page_cache"] = how if cached.page_cache_bytes_per_s else "unmeasured default"
    notes["disk"] = (f"{how}, O_DIRECT" if cached.o_direct else f"{how}, buffered: no O_DIRECT") \
        if cached.disk_bytes_per_s else "unmeasured default"
    return TierRates(link, cached.page_cache_bytes_per_s, cached.disk_bytes_per_s), notes


def learn_rates(model_dir: Path, device: str, observed: dict[str, tuple[int, float]]) -> CachedRates | None:
    """After a run: each file tier's rate its reads reached (`observed`: tier -> (bytes, seconds reads were
    outstanding)), over at least `LEARN_MIN_BYTES`, in place of the cached one; saved and returned, or None when
    nothing was learned (too few bytes, no cached rates to correct, or a rate out of range). OSError: the cache
    could not be written."""
    filesystem = filesystem_key(model_dir)
    cached = load_rates(device, filesystem)
    if cached is None:
        return None
    learned: dict[str, float] = {}
    for tier, name in LEARNED_FIELDS.items():
        nbytes, seconds = observed.get(tier, (0, 0.0))
        if nbytes >= LEARN_MIN_BYTES and seconds > 0:
            learned[name] = nbytes / seconds
    if not learned:
        return None
    said = ", ".join(f"{tier.replace('_', ' ')} {observed[tier][0] / 1e9:.1f} GB" for tier, name in
                     LEARNED_FIELDS.items() if name in learned)
    try:
        fresh = CachedRates.model_validate({**cached.model_dump(), **learned,
                                            "note": f"learned from a run's reads ({said})",
                                            "measured_at": datetime.now(UTC).isoformat(timespec="seconds")})
    except ValidationError:
        return None
    save_rates(fresh)
    return fresh
