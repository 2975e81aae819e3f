"""benchmarks/process_rss.py must work the first time on the GPU machine: its per-phase split of RSS by kind (issue
35: which kind flux16's gap was) and its `resident` mode, run here on the demo model's DiT."""

from __future__ import annotations

import argparse

from benchmarks.process_rss import phase_maxima, print_phases, resident_heap
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.offload import resident_blocks


def test_each_phase_keeps_its_largest_figure_of_each_kind_in_the_order_the_phases_came(capsys):
    samples = [{"phase": "load", "VmRSS": 5, "RssAnon": 4, "RssFile": 1, "RssShmem": 0, "arena": 3, "pinned": 3,
                "outside_arenas": 2},
               {"phase": "load", "VmRSS": 7, "RssAnon": 3, "RssFile": 4, "RssShmem": 0, "arena": 2, "pinned": 2,
                "outside_arenas": 5},
               {"phase": "step 1/2", "VmRSS": 6, "RssAnon": 6, "RssFile": 0, "RssShmem": 1, "arena": 3, "pinned": 0,
                "outside_arenas": 3}]
    by_phase = phase_maxima(samples)
    assert list(by_phase) == ["load", "step 1/2"]
    assert by_phase["load"] == {"rss": 7, "anon": 4, "file": 4, "shmem": 0, "arena": 3, "pinned": 3,
                                "outside_arenas": 5}
    assert by_phase["step 1/2"]["shmem"] == 1
    print_phases(by_phase)
    lines = capsys.readouterr().out.splitlines()
    assert "anon" in lines[0] and "file" in lines[0] and lines[1].startswith("load") and len(lines) == 3


def test_the_resident_mode_moves_every_block_and_gives_the_device_move_back(demo_model_dir):
    real_move = resident_blocks.move_preserving_aliases
    report = resident_heap(argparse.Namespace(model=demo_model_dir))
    dit = next(c for c in discover_model(demo_model_dir).components if c.role == "dit")
    names = [f"{b.attr}.{i}" for b in dit.block_lists for i in range(len(b.block_bytes))]
    for mode in ("untrimmed", "move_resident"):
        rows = report[mode]["blocks"]
        assert [r["block"] for r in rows] == names and all(r["bytes"] > 0 for r in rows)
    assert resident_blocks.move_preserving_aliases is real_move  # the benchmark's stand-in device is gone
