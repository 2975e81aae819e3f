"""`run --trace` on a GPU: the copy and compute streams' tracks hold each streamed block's copy, its forward
and the compute stream's wait for it (CUDA events), each stream's spans one after another."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from omni_console.console.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from trace_format import Complete, TraceFile, check_nesting  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_a_cuda_trace_has_copies_computes_and_stalls_in_stream_order(demo_model_dir: Path, tmp_path: Path):
    trace_path = tmp_path / "trace.json"
    assert main(["run", "--model", str(demo_model_dir), "--device", "cuda", "--output", str(tmp_path / "o.png"),
                 "--resident-layers", "1", "--steps", "3", "--trace", str(trace_path)]) == 0
    trace = TraceFile.model_validate_json(trace_path.read_text())
    check_nesting(trace)
    spans = [e for e in trace.traceEvents if isinstance(e, Complete)]
    compute = [e for e in spans if e.cat == "compute"]
    stalls = [e for e in spans if e.cat == "stall"]
    copies = [e for e in spans if e.cat == "copy" and e.args["direction"] == "h2d"]
    assert len(compute) == 3 * 5 and all(e.dur > 0 for e in compute)  # 5 streamed blocks, 3 steps
    assert stalls and {e.args["block"] for e in stalls} <= {e.name for e in compute}  # waits on ring copies
    assert {e.name for e in compute} <= {e.name for e in copies}
    for track in (compute + stalls, copies):
        ordered = sorted(track, key=lambda e: e.ts)
        assert all(a.ts + a.dur <= b.ts + 1e-3 for a, b in zip(ordered, ordered[1:], strict=False))
    steps = [e for e in spans if e.cat == "step"]
    assert [e.name for e in steps] == ["step 1/3", "step 2/3", "step 3/3"]
