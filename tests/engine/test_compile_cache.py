"""Inductor's cache lives under the tool's cache dir, and a corrupt entry there is a recompile, not a crash: two
fresh processes compile the same blocks with Inductor on the CPU, every cache file garbled between them."""

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
    x = torch.randn(4, 16)
    with torch.no_grad():
        eager = x
        for b in blocks:
            eager = b(eager)
        CompiledBlocks(blocks, CompileSettings(backend="inductor"))
        y = x
        for b in blocks:
            y = b(y)
    print(json.dumps({"diff": float((y - eager).abs().max()), "compiles": CompileWatch.snapshot().compiles}))
""")


def _compile_in_a_fresh_process(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env["OMNI_CONSOLE_CACHE_DIR"] = str(cache)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # Inductor compiles C++ on the CPU, twice
def test_a_corrupt_inductor_cache_entry_is_compiled_again(tmp_path: Path):
    first = _compile_in_a_fresh_process(tmp_path)
    entries = [p for p in (tmp_path / "inductor").rglob("*") if p.is_file() and p.suffix != ".lock"]
    assert entries, "Inductor wrote nothing under the tool's cache dir"
    assert any("fxgraph" in p.parts for p in entries)
    for path in entries:
        path.write_bytes(b"garbage\x80\x04 not a pickle")
    second = _compile_in_a_fresh_process(tmp_path)
    assert second["compiles"] == first["compiles"] > 0
    assert second["diff"] < 1e-5 and first["diff"] < 1e-5
