"""`run` on a host that refuses to page-lock part of the streamed blocks: the report (table and JSON) says how
many blocks and bytes were read from the page cache instead, and the image is the one a host that locks
everything draws. The refusal comes from a page-locker double (`EngineOptions.page_locker`): a CPU has no
driver to refuse."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omni_console.console.cli import main
from omni_console.engine.options import EngineOptions
from omni_console.engine.service import run_plan

REQUEST = ["--device", "cpu", "--steps", "2", "--height", "64", "--width", "64", "--seed", "3"]


class RefusingLocker:
    """Locks (nothing to do on a CPU) the first `allow` ranges; refuses the rest as a driver out of memory does."""

    def __init__(self, allow: int) -> None:
        self.allow, self.asked = allow, 0

    def register(self, ptr: int, nbytes: int) -> str | None:
        self.asked += 1
        return None if self.asked <= self.allow else "cudaHostRegister failed: cudaErrorMemoryAllocation"

    def unregister(self, ptr: int) -> None:
        pass


@pytest.mark.slow
def test_run_reports_the_blocks_a_refused_page_lock_moved_and_draws_the_same_image(
        demo_model_dir: Path, tmp_path: Path, capsys, monkeypatch):
    assert main(["run", "--model", str(demo_model_dir), *REQUEST, "--output", str(tmp_path / "a.png"), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["pin_fallback_blocks"] == 0 and plain["pin_fallback_bytes"] == 0
    monkeypatch.setattr(run_plan, "EngineOptions", functools.partial(EngineOptions, page_locker=RefusingLocker(1)))
    assert main(["run", "--model", str(demo_model_dir), *REQUEST, "--output", str(tmp_path / "b.png"), "--json"]) == 0
    refused = json.loads(capsys.readouterr().out)
    assert refused["pin_fallback_blocks"] > 0 and refused["pin_fallback_bytes"] > 0
    a, b = (np.asarray(Image.open(tmp_path / name)) for name in ("a.png", "b.png"))
    assert a.shape == (64, 64, 3) and np.array_equal(a, b)
    monkeypatch.setattr(run_plan, "EngineOptions", functools.partial(EngineOptions, page_locker=RefusingLocker(1)))
    assert main(["run", "--model", str(demo_model_dir), *REQUEST, "--output", str(tmp_path / "c.png")]) == 0
    table = capsys.readouterr().out
    line = next(x for x in table.splitlines() if "page cache (page-lock refused)" in x)
    assert f"{refused['pin_fallback_blocks']} blocks, " in line
