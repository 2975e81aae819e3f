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


@pytest.mark.slow  # three runs of the tiny transformer
def test_the_steps_are_cut_into_phases_and_the_probe_can_stay_resident(tmp_path, capsys):
    """What the next GPU run must tell: hit and miss steps apart, each cut at the probe and the last block; and with
    the probe resident a hit moves nothing and the floor counts only the streamed blocks' bytes."""
    report = main(["--cpu", "--steps", "5", "--miss-every", "2", "--probe-resident", "--out", str(tmp_path / "c.json")])
    runs = report["runs"]
    assert report["probe_resident"] and report["hit_pattern"] == [0, 1, 0, 1, 0]
    assert runs["cached"]["block_bytes"][0] == 0  # the probe's bytes never cross
    assert [b for b, h in zip(runs["cached"]["h2d_bytes"], report["hit_pattern"], strict=True) if h] == [0, 0]
    for run in runs.values():  # each step's phases add up to the forward, which the step's time holds
        assert len(run["phases"]) == 5
        assert all(0 < sum(p.values()) <= t for p, t in zip(run["phases"], run["times"], strict=True))
    assert set(report["hit_phases_s"]) == {"before_probe", "probe", "blocks", "tail"}
    assert report["hit_step_over_floor"] > 0 and report["miss_step_over_floor"] > 0
    printed = capsys.readouterr().out
    assert "phases ms, streamed cached, hit steps: before_probe " in printed
    assert "phases ms, resident cached, miss steps: " in printed
