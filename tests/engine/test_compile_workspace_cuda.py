"""The compile workspace measured by the engine on the GPU: the compiling first step's allocator peak above the
compiled steps after it, in the request's outcome and its record; the request's device peak still counts the first
step (its peak is read before the one reset that keeps the two apart)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.engine.planning import compile_record
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.policy import build_policy

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def test_the_engine_measures_and_records_the_compile_workspace(demo_model_dir: Path, tmp_path: Path, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    request = GenerateRequest(prompt="a red fox", steps=3, height=64, width=64, seed=1, guidance=3.0)
    engine = Engine(demo_model_dir, device="cuda", options=EngineOptions(compile="regional"))
    try:
        engine.load(build_policy({}, 0, prefetch_slots=2))
        first = engine.generate(request)
        again = engine.generate(request)
    finally:
        engine.close()
    seen = (first.compile.as_dict(), again.compile.as_dict(), first.peak_allocated_bytes)
    assert first.compile.compiles > 0 and first.compile.workspace_bytes is not None, seen
    assert 0 <= first.compile.workspace_bytes < first.peak_allocated_bytes, seen
    assert again.compile.compiles == 0 and again.compile.workspace_bytes is None, seen
    records = list((tmp_path / "cache" / "compile").glob("*.json"))
    assert len(records) == 1
    record, problem = compile_record.read_record(records[0].stem)
    assert problem is None and record is not None and record.workspace_bytes == first.compile.workspace_bytes
