"""After a request, the rate the run's file-tier reads reached replaces the plan's probe (a 256 MiB read its own
way, 0.75-0.80 of the disk's on the H100 machine, where the engine's reader reached 0.87-0.95): the next plan's step
floor and tier choice use what the engine reads at."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from test_fp8_tiers import REQUEST, force_tiers

from omni_console.engine.engine import Engine
from omni_console.engine.events import LogEvent
from omni_console.engine.planning import tier_rates
from omni_console.offload.policy import build_policy


def _probe(model_dir: Path) -> tier_rates.CachedRates:
    """What `plan --ram-budget` caches before the first run: the I/O probe's rates for this file system."""
    files = sorted(model_dir.glob("*/*.safetensors"))
    found = tier_rates.measured_rates(model_dir, "cpu", files=files)
    assert found is not None and found.disk_bytes_per_s is not None
    return found


def test_a_runs_disk_reads_replace_the_probes_rate(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tier_rates, "LEARN_MIN_BYTES", 1)  # the demo's blocks are small: any read teaches
    probed = _probe(demo_model_dir)
    force_tiers(monkeypatch, "disk")
    engine = Engine(demo_model_dir, device="cpu")
    sub = engine.bus.subscribe()
    try:
        engine.load(build_policy({}, 0))
        engine.generate(REQUEST, threading.Event())
        nbytes, seconds = engine.placement.streamer.filler.read_totals()["disk"]
    finally:
        engine.close()
    assert nbytes > 0 and seconds > 0
    learned = tier_rates.load_rates("cpu", tier_rates.filesystem_key(demo_model_dir))
    assert learned is not None and learned.disk_bytes_per_s == pytest.approx(nbytes / seconds)
    assert learned.page_cache_bytes_per_s == probed.page_cache_bytes_per_s  # no page-cache reads: kept
    assert learned.note.startswith("learned from a run's reads (disk ")
    lines = [e.message for e in sub.drain() if isinstance(e, LogEvent) and "tier rates learned" in e.message]
    assert len(lines) == 1 and lines[0].startswith("request 1: tier rates learned from a run's reads")


def test_too_few_bytes_or_no_probe_teach_nothing(demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    fs = tier_rates.filesystem_key(demo_model_dir)
    assert tier_rates.learn_rates(demo_model_dir, "cpu", {"disk": (10 << 30, 5.0)}) is None  # nothing to correct
    assert tier_rates.load_rates("cpu", fs) is None
    probed = _probe(demo_model_dir)
    assert tier_rates.learn_rates(demo_model_dir, "cpu", {"disk": (tier_rates.LEARN_MIN_BYTES - 1, 0.1)}) is None
    assert tier_rates.learn_rates(demo_model_dir, "cpu", {"disk": (10 << 30, 0.0)}) is None
    assert tier_rates.load_rates("cpu", fs) == probed
    learned = tier_rates.learn_rates(demo_model_dir, "cpu", {"page_cache": (4 << 30, 0.5), "disk": (2 << 30, 1.0)})
    assert learned is not None and tier_rates.load_rates("cpu", fs) == learned
    assert (learned.page_cache_bytes_per_s, learned.disk_bytes_per_s) == (8 * 2**30, 2 * 2**30)
    assert learned.note == "learned from a run's reads (page cache 4.3 GB, disk 2.1 GB)"
