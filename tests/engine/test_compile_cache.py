"""Inductor's cache lives under the tool's cache dir; a second start with it is warm, and a corrupt entry there is a
recompile, not a crash. Each test compiles the same blocks with Inductor on the CPU in fresh processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import json, torch
    from torch._dynamo.utils import counters  # as diffusers' pipelines do: torch writes its default cache dir
    from omni_console.engine.running.request_compile import use_tool_cache
    from omni_console.offload.block_compile import CompiledBlocks, CompileSettings, CompileWatch
    use_tool_cache()
    torch.manual_seed(0)
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)
        def forward(self, x):
            return x + self.b(torch.nn.functional.gelu(self.a(x)))
    blocks = torch.nn.ModuleList([Block() for _ in range(3)])
    x = torch.randn(1, 4, 16)
    def run():  # after the first block, each input is a slice of a wider tensor (its batch stride differs)
        y = x
        for b in blocks:
            y = torch.cat([b(y), x], dim=1)[:, :4]
        return y
    with torch.no_grad():
        eager = run()
        CompiledBlocks(blocks, CompileSettings(backend="inductor"))
        y = run()
    found = {**counters["inductor"], **counters["aot_autograd"]}
    print(json.dumps({"diff": float((y - eager).abs().max()), "compiles": CompileWatch.snapshot().compiles,
                      **{k: found.get(k, 0) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss",
                                                      "autograd_cache_hit", "autograd_cache_miss")}}))
""")


def test_torchs_own_default_cache_dir_gives_way_to_the_tools(tmp_path: Path, monkeypatch):
    """Importing diffusers' pipelines makes torch write its default (/tmp/torchinductor_<user>) into
    TORCHINDUCTOR_CACHE_DIR: that value is replaced by the tool's dir; an operator's own value is kept."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from omni_console.engine.running.request_compile import use_tool_cache

    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    use_tool_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "inductor" / "triton")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    use_tool_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "operators"))
    use_tool_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "operators")


def _compile_in_a_fresh_process(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env["OMNI_CONSOLE_CACHE_DIR"] = str(cache)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # Inductor compiles C++ on the CPU, once
def test_a_second_start_loads_every_graph_from_the_tool_cache(tmp_path: Path):
    """The warm start: one graph for the class (a slice's batch stride compiles nothing new), found in Inductor's
    FX graph cache and the AOTAutograd cache under the tool's cache dir, nothing compiled by Inductor again."""
    first = _compile_in_a_fresh_process(tmp_path)
    assert first["compiles"] == 1 and first["fxgraph_cache_miss"] == 1 and first["autograd_cache_miss"] == 1
    assert any((tmp_path / "inductor").rglob("*")), "Inductor wrote nothing under the tool's cache dir"
    second = _compile_in_a_fresh_process(tmp_path)
    assert second["compiles"] == 1
    assert second["autograd_cache_hit"] == 1 and second["autograd_cache_miss"] == 0
    assert second["fxgraph_cache_hit"] == 1 and second["fxgraph_cache_miss"] == 0
    assert second["diff"] == first["diff"] and first["diff"] < 1e-5


@pytest.mark.slow  # Inductor compiles C++ on the CPU, twice
def test_a_corrupt_inductor_cache_entry_is_compiled_again(tmp_path: Path):
    first = _compile_in_a_fresh_process(tmp_path)
    entries = [p for p in (tmp_path / "inductor").rglob("*") if p.is_file() and p.suffix != ".lock"]
    assert entries, "Inductor wrote nothing under the tool's cache dir"
    assert any("fxgraph" in p.parts for p in entries) and any("aotautograd" in p.parts for p in entries)
    for path in entries:
        path.write_bytes(b"garbage\x80\x04 not a pickle")
    second = _compile_in_a_fresh_process(tmp_path)
    assert second["compiles"] == first["compiles"] > 0
    assert second["autograd_cache_hit"] == 0 and second["fxgraph_cache_hit"] == 0  # compiled again, not loaded
    assert second["diff"] < 1e-5 and first["diff"] < 1e-5
