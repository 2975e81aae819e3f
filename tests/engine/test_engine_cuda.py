"""The engine on a real GPU (run on the GPU machine: `pytest -m cuda`).

Oracle: the plain diffusers pipeline on the same device, same seed. The demo model is float32 and
weights are copied exactly, so outputs must be bit-identical; the tolerance is 0.
"""

from __future__ import annotations

import gc
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_families import FAMILY_GENERATION

from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.events import StagingEvent
from omni_console.offload.pinned import pinned_bytes_held
from omni_console.offload.policy import build_policy

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def demo_request(seed: int = 11) -> GenerateRequest:
    gen = dict(FAMILY_GENERATION["flux"])
    return GenerateRequest(prompt="a lighthouse", steps=gen.pop("num_inference_steps"), height=gen.pop("height"),
                           width=gen.pop("width"), seed=seed, extra=gen)


@pytest.fixture(scope="module")
def cuda_oracle(demo_model_dir: Path) -> np.ndarray:
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(demo_model_dir, local_files_only=True).to("cuda")
    pipe.set_progress_bar_config(disable=True)
    image = np.asarray(pipe(**demo_request().call_kwargs(pipe)).images[0])
    del pipe
    gc.collect()
    torch.cuda.empty_cache()
    return image


def test_every_policy_matches_plain_diffusers_on_cuda(demo_model_dir: Path, cuda_oracle: np.ndarray):
    engine = Engine(demo_model_dir, device="cuda")
    aux = engine.model.auxiliary_names
    for flags in itertools.product([True, False], repeat=len(aux)):
        for layers in (0, 1, engine.model.num_dit_blocks):
            engine.load(build_policy(dict(zip(aux, flags, strict=True)), layers))
            image = np.asarray(engine.generate(demo_request()).image)
            assert np.array_equal(image, cuda_oracle), (flags, layers)
            engine.unload()
    engine.close()


def test_pinned_bytes_peak_bandwidth_and_unload(demo_model_dir: Path):
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base_alloc = torch.cuda.memory_allocated()
    base_pinned = pinned_bytes_held()
    engine = Engine(demo_model_dir, device="cuda")
    sub = engine.bus.subscribe()
    engine.load(build_policy({"default": True}, 0))
    streamer = engine.placement.streamer
    streamed = streamer.streamed_bytes
    assert streamer.pinned_bytes > 0
    assert streamer.pinned_bytes <= 1.02 * streamed, (streamer.pinned_bytes, streamed)
    result = engine.generate(demo_request())
    h2d = [e for e in sub.drain() if isinstance(e, StagingEvent) and e.direction == "h2d"]
    assert h2d and all(e.gbps > 0 for e in h2d)
    dit = engine.model.component("transformer")
    largest = max(b.largest_bytes for b in dit.block_lists)
    # peak over the whole request: the largest staged component also passes through the device
    staged_max = max(s.staged_bytes for s in engine.placement.stagers.values())
    print(f"\npinned {streamer.pinned_bytes} / streamed {streamed} = {streamer.pinned_bytes / streamed:.4f}; "
          f"peak allocated {result.peak_allocated_bytes}; non-block {dit.non_block_bytes}; largest block {largest}; "
          f"mean H2D {sum(e.nbytes for e in h2d) / sum(e.seconds for e in h2d) / 1e9:.2f} GB/s")
    assert result.peak_allocated_bytes < dit.non_block_bytes + 2 * largest + staged_max + 64 * 2**20
    engine.unload()
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base_alloc
    assert pinned_bytes_held() == base_pinned


def test_every_weight_is_read_in_place_and_pinned_exactly_once(demo_model_dir: Path, cuda_oracle: np.ndarray):
    """On CUDA the DiT blocks go straight into the block arena and the transformers encoders are built
    over their own page-locked arenas: no `from_pretrained` read, staged masters used in place."""
    from omni_console.offload.events import LogEvent

    gc.collect()
    held_before = pinned_bytes_held()
    engine = Engine(demo_model_dir, device="cuda", options=EngineOptions(live_replan=True))
    events = engine.bus.subscribe()
    engine.load(build_policy({"text_encoder": True, "text_encoder_2": True, "vae": True}, 1))
    lines = [e.message for e in events.drain() if isinstance(e, LogEvent)]
    assert not any("from_pretrained" in line for line in lines), lines
    placement = engine.placement
    for name in ("text_encoder", "text_encoder_2", "vae"):
        stager = placement.stagers[name]
        tensors = len(list(stager.module.parameters())) + len(list(stager.module.buffers()))
        assert 0 < stager.staged_bytes <= stager.pinned_bytes <= stager.staged_bytes + 256 * tensors, name
    streamer = placement.streamer  # pinned block by block: every region, not the page gaps between them
    assert streamer.streamed_bytes <= streamer.pinned_bytes <= streamer.host_bytes
    assert pinned_bytes_held() - held_before == placement.pinned_bytes
    assert np.array_equal(np.asarray(engine.generate(demo_request()).image), cuda_oracle)
    engine.replan(build_policy({"text_encoder": False, "text_encoder_2": True, "vae": True}, 0))
    assert np.array_equal(np.asarray(engine.generate(demo_request()).image), cuda_oracle)
    engine.close()
    gc.collect()
    assert pinned_bytes_held() == held_before
