"""benchmarks/cache_stream.py must work the first time on the GPU machine: its `--cpu` mode runs the whole script
on the tiny Flux preset, with the hit pattern it chose and the ring's bytes as the issue's ratios read them."""

from __future__ import annotations

import json

import pytest

from benchmarks.cache_stream import main


@pytest.mark.slow  # three runs of the tiny transformer
def test_the_cpu_mode_reports_the_chosen_hit_pattern_and_the_bytes(tmp_path, capsys):
    out = tmp_path / "cache.json"
    report = main(["--cpu", "--steps", "6", "--miss-every", "3", "--out", str(out)])
    assert json.loads(out.read_text())["hit_pattern"] == report["hit_pattern"] == [0, 1, 1, 0, 1, 1]
    assert report["hit_rate"] == pytest.approx(4 / 6)
    runs = report["runs"]
    per_forward = runs["cached"]["copy_bytes_per_forward"]
    assert runs["uncached"]["h2d_bytes"][1:] == [per_forward] * 5  # uncached: every block, every step
    assert report["bytes_skipped"] == 4 * (per_forward - runs["cached"]["block_bytes"][0])
    assert 0 < report["bytes_moved"] <= report["bytes_of_blocks_run"] < 5 * per_forward
    assert report["floor_s"] > 0 and report["step_over_floor"] > 0 and report["speedup_over_uncached"] > 0
    printed = capsys.readouterr().out
    assert "hit_pattern: [0, 1, 1, 0, 1, 1]" in printed and "step_over_floor:" in printed
