"""Measured hit rates per (family, --cache setting, steps): kept after a cached request (which keeps no request
profile: its steps skipped blocks), read back by the next plan, and a hostile file is ignored, never trusted."""

from __future__ import annotations

import os

import pytest

from omni_console.console.cli import main
from omni_console.engine.cache_dir import cache_root
from omni_console.engine.running.cache_hits import FILE, measured_hits, record_hits
from omni_console.engine.running.cache_spec import parse_cache

SPEC = parse_cache("first-block:threshold=0.5")


def test_counts_add_up_per_key_and_the_most_measured_step_count_answers():
    record_hits("CountsPipeline", SPEC, 5, 5, 3)
    record_hits("CountsPipeline", SPEC, 5, 5, 4)
    record_hits("CountsPipeline", SPEC, 2, 2, 1)
    record_hits("OtherPipeline", SPEC, 9, 90, 90)
    got = measured_hits("CountsPipeline", SPEC)
    assert (got.forwards, got.hits, got.steps) == (10, 7, 5) and got.rate == 0.7
    assert measured_hits("CountsPipeline", parse_cache("first-block:threshold=0.1")) is None


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"FluxPipeline|first-block:threshold=0.5|5": [3, 5]}',
                                     '{"FluxPipeline|first-block:threshold=0.5|5": [true, 1]}',
                                     '{"FluxPipeline|first-block:threshold=0.5|x": [5, 1]}'])
def test_a_bad_file_or_entry_is_ignored(content):
    path = cache_root() / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    assert measured_hits("FluxPipeline", SPEC) is None
    record_hits("FluxPipeline", SPEC, 5, 5, 2)  # and replaced by what is measured next
    assert measured_hits("FluxPipeline", SPEC).hits == 2


def test_a_symlinked_file_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text('{"FluxPipeline|first-block:threshold=0.5|5": [5, 5]}')
    path = cache_root() / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    os.symlink(target, path)
    assert measured_hits("FluxPipeline", SPEC) is None
    path.unlink()


@pytest.mark.slow  # two runs and three plans of the demo model
def test_the_next_plan_uses_the_measured_hit_rate_and_a_cached_run_keeps_no_profile(demo_model_dir, tmp_path,
                                                                                        capsys, monkeypatch):
    # a cache of its own: another test's run of the demo model would have left step times measured
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    assert not (cache_root() / FILE).exists()
    cache = ["--cache", "first-block:threshold=0.5"]
    out = str(tmp_path / "o.png")

    def plan_line() -> str:
        capsys.readouterr()
        assert main(["plan", "--model", str(demo_model_dir), *cache]) == 0
        return capsys.readouterr().out.strip().splitlines()[-1]

    assert "measured here" not in plan_line()
    assert main(["run", "--model", str(demo_model_dir), "--prompt", "a red fox", "--seed", "3", "--steps", "5",
                 "--output", out, *cache]) == 0
    line = plan_line()
    assert line.endswith("measured here: 3 of 5 forwards hit (60%, at 5 steps)")  # the demo's pattern at seed 3
    assert "unknown until measured" in line  # the cached run left the model's step times unmeasured
    assert main(["run", "--model", str(demo_model_dir), "--prompt", "a red fox", "--steps", "5", "--output", out,
                 "--overwrite"]) == 0
    line = plan_line()
    no_hits, best = (float(part.split(" s")[0]) for part in line.split("forecast: ")[1].split(" down to "))
    expected = float(line.split("about ")[1].split(" s")[0])
    assert best < expected < no_hits and expected == pytest.approx(no_hits + 0.6 * (best - no_hits), abs=2e-3)
