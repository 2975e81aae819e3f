"""A text encoder streamed layer by layer on a GPU: the same output as staged whole, bit for bit, and
a text phase that holds two layers instead of all of them."""

from __future__ import annotations

import copy

import pytest
import torch

from omni_console.engine.demo.demo_model import tiny_t5_config
from omni_console.offload.layer_stage import LayerStage
from omni_console.offload.staged_calls import stage_around
from omni_console.offload.stager import ModuleStager

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

DEV = torch.device("cuda", 0)
LAYERS = 12


def _encoder() -> torch.nn.Module:
    from transformers import T5EncoderModel

    torch.manual_seed(0)
    return T5EncoderModel(tiny_t5_config(1000, d_model=512, layers=LAYERS)).eval().to(torch.bfloat16)


def _phase_peak(module: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    torch.cuda.synchronize(DEV)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(DEV)
    torch.cuda.reset_peak_memory_stats(DEV)
    with torch.no_grad():
        out = module(input_ids=ids).last_hidden_state.clone()
    torch.cuda.synchronize(DEV)
    return out, torch.cuda.max_memory_allocated(DEV) - before


def test_streamed_equals_staged_on_the_gpu_and_holds_two_layers():
    staged_module = _encoder()
    streamed_module = copy.deepcopy(staged_module)
    ids = torch.randint(0, 990, (2, 64), generator=torch.Generator().manual_seed(1)).to(DEV)
    stager = ModuleStager("t5", staged_module, DEV)
    undo_staged = stage_around(stager, staged_module)
    expected, staged_peak = _phase_peak(staged_module, ids)
    undo_staged()
    stager.close()
    stage = LayerStage("t5", streamed_module, list(streamed_module.encoder.block), DEV)
    undo = stage_around(stage, streamed_module)
    try:
        for _ in range(2):
            got, streamed_peak = _phase_peak(streamed_module, ids)
            assert torch.equal(got, expected)
            assert stage.ring.num_slots == 0  # nothing of the encoder on the device between prompts
    finally:
        undo()
        stage.close()
    layer = stage.ring.largest_block_bytes
    assert streamed_peak < staged_peak - (LAYERS - 3) * layer  # about two layers held, not twelve
