"""`run` goes through the engine's request service, which keeps each request in the cache's history:
the request, its policy, figures, files and the very report `run --json` printed, read back by a later
process; a corrupt history is one note on stderr and is replaced by a valid one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_console.console.cli import main
from omni_console.engine.service.history import History

FAST = ["--height", "64", "--width", "64", "--steps", "1"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(folder))
    return folder


@pytest.mark.slow
def test_each_run_is_kept_in_the_history_with_the_report_it_printed(demo_model_dir, tmp_path, cache, capsys):
    reports = []
    for seed in (3, 4):
        out = tmp_path / f"s{seed}.png"
        assert main(["run", "--model", str(demo_model_dir), "--output", str(out), "--seed", str(seed), *FAST,
                     "--json"]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    entries = History(cache / "history.json").entries  # as a new process reads it
    assert [(e.status, e.request.seed, e.request.steps, e.files) for e in entries] == \
        [("done", 3, 1, [str(tmp_path / "s3.png")]), ("done", 4, 1, [str(tmp_path / "s4.png")])]
    assert [e.report for e in entries] == reports
    assert entries[0].policy == reports[0]["policy"] and entries[0].model == str(demo_model_dir)
    assert entries[1].seconds == pytest.approx(reports[1]["request_seconds"])


@pytest.mark.slow
def test_a_corrupt_history_is_one_note_and_the_run_goes_on(demo_model_dir, tmp_path, cache, capsys):
    cache.mkdir()
    (cache / "history.json").write_text('{"schema": "omni-console.history/1", "entries": [{"ticket": -1}]}')
    assert main(["run", "--model", str(demo_model_dir), "--output", str(tmp_path / "o.png"), *FAST]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "history" in line]
    assert notes == [f"note: history {cache / 'history.json'} ignored: is not a valid history file"]
    again = History(cache / "history.json")  # replaced by a valid file holding this run only
    assert again.note is None
    assert [(e.status, e.request.prompt) for e in again.entries] == [("done", "a lighthouse on a cliff at dusk")]


@pytest.mark.slow
def test_a_cached_run_is_kept_with_its_cache_and_submitted_again_with_it(demo_model_dir, tmp_path, cache, capsys):
    from omni_console.engine.api import checks, service

    parse_cache, request_of = checks.parse_cache, service.request_of

    assert main(["run", "--model", str(demo_model_dir), "--output", str(tmp_path / "o.png"), *FAST,
                 "--cache", "first-block:threshold=0.2"]) == 0
    (entry,) = History(cache / "history.json").entries
    assert entry.request.cache == "first-block:threshold=0.2"
    assert request_of(entry).cache == parse_cache("first-block:threshold=0.2")
    text = (cache / "history.json").read_text().replace('"first-block:threshold=0.2"', '"bogus"')
    (cache / "history.json").write_text(text)  # a tampered --cache makes the file invalid, never a request
    again = History(cache / "history.json")
    assert again.entries == []
    assert again.note == f"history {cache / 'history.json'} ignored: is not a valid history file"
