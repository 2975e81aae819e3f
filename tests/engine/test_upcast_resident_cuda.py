"""fp8 resident blocks kept upcast on CUDA: converted once on the device (the copy from the arena and the
conversion on one stream, the fp8 copy freed after), bit for bit diffusers' layerwise casting, and the
device holding the compute dtype's bytes for those blocks (allocator figures, not the plan's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_stream_dtype_cuda import demo_request, layerwise_casting_image

from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.offload.policy import build_policy

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
FP8 = torch.float8_e4m3fn


def test_kept_upcast_blocks_match_layerwise_casting_and_hold_their_bytes(demo_model_dir: Path):
    expected = layerwise_casting_image(demo_model_dir)
    for live in (False, True):
        engine = Engine(demo_model_dir, device="cuda", options=EngineOptions(live_replan=live))
        held = {}
        for upcast in (0, 2):
            engine.load(build_policy({}, 3, "dlo", "leading", 2, stream_dtype="float8_e4m3fn",
                                     upcast_resident=upcast))
            torch.cuda.synchronize()
            held[upcast] = torch.cuda.memory_allocated()
            kept = [b for b in engine.plan.blocks if b.kept_upcast]  # type: ignore[union-attr]
            assert len(kept) == upcast
            image = np.asarray(engine.generate(demo_request()).image)
            assert np.array_equal(image, expected), (live, upcast)
            engine.unload()
            if upcast:  # each kept block: its fp8 elements at 4 bytes instead of 1 (float32 demo), its fp8 copy freed
                extra = sum(b.upcast_extra_bytes for b in kept)
                assert held[upcast] - held[0] == pytest.approx(extra, rel=0.05, abs=64 * 1024)
        if live:  # a live re-plan converts and puts back between requests
            policy = build_policy({}, 3, stream_dtype="float8_e4m3fn")
            engine.load(policy)
            engine.replan(policy.model_copy(update={"upcast_resident": 3}))
            assert np.array_equal(np.asarray(engine.generate(demo_request()).image), expected)
            engine.unload()
        engine.close()
