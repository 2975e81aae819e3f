"""`run --trace PATH`: the request's trace beside its output, valid and nested, refused before any load when
it could not be written, and never written over a file unasked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from omni_console.console.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from trace_format import Complete, TraceFile, check_nesting  # noqa: E402


def test_run_writes_a_trace_of_each_blocks_copy_and_compute(demo_model_dir: Path, tmp_path: Path, capsys):
    trace_path = tmp_path / "trace.json"
    code = main(["run", "--headless", "--model", str(demo_model_dir), "--output", str(tmp_path / "o.png"),
                 "--resident-layers", "1", "--trace", str(trace_path), "--steps", "2"])
    assert code == 0
    assert f"trace: {trace_path}" in capsys.readouterr().err
    trace = TraceFile.model_validate_json(trace_path.read_text())
    check_nesting(trace)
    spans = [e for e in trace.traceEvents if isinstance(e, Complete)]
    steps = [e for e in spans if e.cat == "step"]
    assert [e.name for e in steps] == ["step 1/2", "step 2/2"]
    assert {e.name for e in spans if e.cat == "phase"} == {"text_encoding", "denoise", "vae_decode"}
    # 5 of the demo DiT's 6 blocks stream (one resident): each step computes each of them once, on the compute track
    compute = [e for e in spans if e.cat == "compute"]
    assert len(compute) == 2 * 5 and all(e.tid == 3 for e in compute)
    assert len({e.name for e in compute}) == 5
    for step in steps:  # each block's forward lies inside its step
        inside = [e for e in compute if step.ts <= e.ts and e.ts + e.dur <= step.ts + step.dur + 1]
        assert len(inside) == 5
    copies = [e for e in spans if e.cat == "copy"]
    assert {e.name for e in compute} <= {e.name for e in copies} and all(e.tid == 2 for e in copies)


def test_a_trace_that_exists_is_refused_before_anything_loads(demo_model_dir: Path, tmp_path: Path, capsys):
    trace_path = tmp_path / "trace.json"
    trace_path.write_text("mine")
    code = main(["run", "--headless", "--model", str(demo_model_dir), "--output", str(tmp_path / "o.png"),
                 "--trace", str(trace_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "--trace" in err and "exists; pass --overwrite" in err and len(err.strip().splitlines()) == 1
    assert trace_path.read_text() == "mine" and not (tmp_path / "o.png").exists()


@pytest.mark.parametrize(("name", "words"), [("trace.txt", "a trace is JSON"), (".", "is a directory")])
def test_a_trace_name_that_cannot_be_a_trace_is_refused_before_the_model_is_read(tmp_path: Path, capsys, name: str,
                                                                                 words: str):
    code = main(["run", "--headless", "--model", str(tmp_path / "nowhere"), "--output", str(tmp_path / "o.png"),
                 "--trace", str(tmp_path / name)])
    assert code == 2
    err = capsys.readouterr().err
    assert "--trace" in err and words in err and "nowhere" not in err  # before the model's path is looked at
