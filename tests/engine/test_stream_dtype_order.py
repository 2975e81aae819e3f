"""fp8 storage with block-order correction (Lumina2 registers `noise_refiner` first but runs
`context_refiner` first): the corrected plan keeps its fp8 bytes, and the images of the corrected run and
of the next load are bit-identical to diffusers' `enable_layerwise_casting`."""

from __future__ import annotations

from pathlib import Path

import diffusers
import numpy as np
import pytest
import torch
from test_block_order_observed import LUMINA2_RAN, request_for
from tiny_families_shapes import build_tiny_lumina2

from omni_console.engine.engine import Engine
from omni_console.engine.events import BlockOrderCorrected
from omni_console.offload.policy import build_policy

FP8 = "float8_e4m3fn"


@pytest.mark.slow
def test_corrected_order_keeps_fp8_storage_and_matches_layerwise_casting(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))
    path = build_tiny_lumina2(tmp_path / "lumina2", seed=0)
    req = request_for("lumina2")
    pipe = diffusers.Lumina2Pipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    unchanged = np.asarray(pipe(**req.call_kwargs(pipe)).images[0])
    pipe.transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=pipe.transformer.dtype)
    expected = np.asarray(pipe(**req.call_kwargs(pipe)).images[0])
    assert not np.array_equal(unchanged, expected)
    del pipe

    for attempt in ("corrected", "next load"):
        engine = Engine(path, device="cpu")
        sub = engine.bus.subscribe()
        engine.load(build_policy({}, 1, stream_dtype=FP8))
        planned = [b.nbytes for b in engine.plan.blocks]
        assert sum(planned) < 0.6 * engine.plan.model.dits[0].block_bytes  # fp8 bytes, not the file's
        image = np.asarray(engine.generate(req).image)
        corrected = [e for e in sub.drain() if isinstance(e, BlockOrderCorrected)]
        assert len(corrected) == (1 if attempt == "corrected" else 0)
        assert [b.attr for b in engine.plan.model.dits[0].block_lists] == LUMINA2_RAN
        assert engine.plan.stream_dtype == FP8 and sorted(b.nbytes for b in engine.plan.blocks) == sorted(planned)
        assert np.array_equal(image, expected), attempt
        engine.close()
