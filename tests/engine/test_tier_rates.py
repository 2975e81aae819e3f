"""The tiers' read rates: probed once on the checkpoint's file system (O_DIRECT, or the fallback recorded where
the file system has none), cached, and the cache read as untrusted input (ignored with one note)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omni_console.engine.planning import io_probe
from omni_console.engine.planning.tier_rates import (
    CachedRates,
    filesystem_key,
    load_rates,
    measured_rates,
    rates_path,
    tier_rates,
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(root))
    return root


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A folder shaped like a checkpoint: one component with a 3 MiB file of random bytes."""
    root = tmp_path / "model"
    (root / "transformer").mkdir(parents=True)
    (root / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(os.urandom(3 * 2**20))
    return root


def test_the_probe_measures_both_rates_once_and_caches_them(model_dir: Path, cache: Path):
    notes: list[str] = []
    first = measured_rates(model_dir, "cpu", notes)
    assert first is not None and first.page_cache_bytes_per_s and first.disk_bytes_per_s
    assert rates_path("cpu", filesystem_key(model_dir)).is_file() and not notes
    # O_DIRECT where the file system has it; else the fallback is recorded, not an error
    assert first.o_direct or "O_DIRECT" in first.note
    again = measured_rates(model_dir, "cpu", notes, probe=False)
    assert again == first  # read back from the cache, not measured again
    rates, said = tier_rates(again, 2e10)
    assert rates.page_cache == first.page_cache_bytes_per_s and rates.link == 2e10
    assert said["pinned"] == "measured" and said["page_cache"].startswith("cached")


def test_a_file_system_without_o_direct_is_recorded_and_falls_back(model_dir: Path, cache: Path,
                                                                   monkeypatch: pytest.MonkeyPatch):
    def refuse(path, length):
        raise OSError(22, "Invalid argument")  # what tmpfs answers to O_DIRECT

    monkeypatch.setattr(io_probe, "_direct_rate", refuse)
    found = measured_rates(model_dir, "cpu")
    assert found is not None and not found.o_direct and "O_DIRECT unsupported" in found.note
    assert found.disk_bytes_per_s == found.page_cache_bytes_per_s
    assert "buffered" in tier_rates(found, None)[1]["disk"]


def test_nothing_to_read_leaves_the_rates_unmeasured(tmp_path: Path, cache: Path):
    (tmp_path / "empty" / "vae").mkdir(parents=True)
    found = measured_rates(tmp_path / "empty", "cpu")
    assert found is not None and found.page_cache_bytes_per_s is None
    rates, said = tier_rates(found, None)
    assert rates.page_cache is None and said["page_cache"] == "unmeasured default"


@pytest.mark.parametrize("text", [
    '{"version": 1, "device": "cpu", "filesystem": "FS", "page_cache_bytes_per_s": 1e400, "disk_bytes_per_s": 1e9,'
    ' "o_direct": true, "note": "", "measured_at": "2026-12-05"}',
    '{"version": 1, "device": "cpu", "filesystem": "FS", "page_cache_bytes_per_s": -5, "disk_bytes_per_s": 1e9,'
    ' "o_direct": true, "note": "", "measured_at": "2026-12-05"}',
    '{"version": 1, "device": "other", "filesystem": "FS", "page_cache_bytes_per_s": 1e9, "disk_bytes_per_s": 1e9,'
    ' "o_direct": true, "note": "", "measured_at": "2026-12-05"}',
    "[" * 5000,
    "x" * 10_000,
])
def test_a_bad_cache_file_is_ignored_with_one_note(model_dir: Path, cache: Path, text: str):
    fs = filesystem_key(model_dir)
    path = rates_path("cpu", fs)
    path.parent.mkdir(parents=True)
    path.write_text(text.replace("FS", fs))
    notes: list[str] = []
    assert load_rates("cpu", fs, notes) is None
    assert len(notes) == 1 and "ignored" in notes[0] and "\n" not in notes[0]


def test_a_fifo_or_symlink_as_the_cache_file_is_not_followed(model_dir: Path, cache: Path, tmp_path: Path):
    fs = filesystem_key(model_dir)
    path = rates_path("cpu", fs)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    notes: list[str] = []
    assert load_rates("cpu", fs, notes) is None and "not a regular file" in notes[0]
    path.unlink()
    path.symlink_to("/dev/zero")
    assert load_rates("cpu", fs, notes) is None and "symbolic link" in notes[1]


def test_a_good_cache_file_is_used(model_dir: Path, cache: Path):
    fs = filesystem_key(model_dir)
    good = CachedRates(device="cpu", filesystem=fs, page_cache_bytes_per_s=3e9, disk_bytes_per_s=7e9, o_direct=True,
                       note="", measured_at="2026-12-05T00:00:00+00:00")
    path = rates_path("cpu", fs)
    path.parent.mkdir(parents=True)
    path.write_text(good.model_dump_json())
    assert measured_rates(model_dir, "cpu", probe=False) == good


def test_the_disk_probe_keeps_its_reads_in_flight_past_a_slow_one(model_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """A slow read holds up only its own reader: the others go on with the next chunks, as the engine's disk tier
    reads. The probe used to wait for each batch's slowest read before the next batch (and timed 0.75-0.80 of the
    disk where the engine's reader reaches 0.87-0.95). Here the first read returns only once three others have."""
    import threading

    path = model_dir / "transformer" / "diffusion_pytorch_model.safetensors"
    chunk = 64 * 1024
    monkeypatch.setattr(io_probe, "CHUNK", chunk)
    monkeypatch.setattr(io_probe, "READERS", 2)
    monkeypatch.setattr(io_probe.os, "O_DIRECT", 0, raising=False)  # any file system: the schedule is the test
    real_preadv = os.preadv
    others_done = threading.Semaphore(0)
    offsets: list[int] = []
    waited: list[bool] = []

    def preadv(fd: int, buffers, offset: int) -> int:
        if offset == 0:
            waited.append(all(others_done.acquire(timeout=5) for _ in range(3)))
        n = real_preadv(fd, buffers, offset)
        offsets.append(offset)
        if offset:
            others_done.release()
        return n

    monkeypatch.setattr(io_probe.os, "preadv", preadv)
    rate = io_probe._direct_rate(path, 16 * chunk)
    assert waited == [True], "the other readers stopped behind the slow read"
    assert sorted(offsets) == list(range(0, 16 * chunk, chunk)) and rate > 0  # every chunk read once
