"""A streamed encoder read into one host arena (as engine/loading/arena_load.py reads every component): its
stager stages only the weights outside the layers, not the arena's whole storage, and the output is
the staged-whole encoder's, bit for bit."""

from __future__ import annotations

import copy

import torch

from omni_console.engine.demo.demo_model import tiny_t5_config
from omni_console.offload.layer_stage import LayerStage
from omni_console.offload.staged_calls import stage_around
from omni_console.offload.stager import ModuleStager

LAYERS = 4


def _encoder_in_one_storage() -> torch.nn.Module:
    """A T5 encoder whose every weight is a view into one flat uint8 buffer, in declaration order (its
    layers of about 12 MB each: larger than the gap `used_spans` still bridges)."""
    from transformers import T5EncoderModel

    torch.manual_seed(0)
    module = T5EncoderModel(tiny_t5_config(1000, d_model=512, layers=LAYERS)).eval()
    params = list({id(p): p for p in module.parameters()}.values())
    sizes = [-(-p.nbytes // 64) * 64 for p in params]
    arena = torch.empty(sum(sizes), dtype=torch.uint8)
    offset = 0
    for p, size in zip(params, sizes, strict=True):
        view = arena[offset:offset + p.nbytes].view(p.dtype).view(p.shape)
        view.copy_(p.data)
        p.data = view
        offset += size
    return module


def _outer_bytes(module: torch.nn.Module) -> int:
    inner = {id(p) for p in module.encoder.block.parameters()}
    return sum(p.nbytes for p in {id(p): p for p in module.parameters()}.values() if id(p) not in inner)


def test_a_streamed_encoder_in_one_arena_stages_only_its_outer_weights():
    module = _encoder_in_one_storage()
    whole = copy.deepcopy(module)
    layers = list(module.encoder.block)
    arena_bytes = module.shared.weight.untyped_storage().nbytes()
    stage = LayerStage("text_encoder", module, layers, "cpu", pin=False)
    try:
        outer = _outer_bytes(module)
        assert outer < arena_bytes / 2  # the layers are most of the arena
        assert outer <= stage.stager.staged_bytes <= outer + 64 * 16  # span alignment, never the layers
        stage_around(stage, module)
        reference = ModuleStager("whole", whole, "cpu", pin=False)
        stage_around(reference, whole)
        ids = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            got = module(input_ids=ids).last_hidden_state
            want = whole(input_ids=ids).last_hidden_state
        assert torch.equal(got, want)
        reference.close()
    finally:
        stage.close()


def test_a_staged_module_in_one_arena_still_stages_every_weight_once():
    module = _encoder_in_one_storage()
    stager = ModuleStager("text_encoder", module, "cpu", pin=False)
    try:
        total = sum(p.nbytes for p in {id(p): p for p in module.parameters()}.values())
        assert total <= stager.staged_bytes <= total + 64 * 64
    finally:
        stager.close()


def test_the_ring_reads_the_layers_in_place_so_the_arena_is_the_only_host_copy():
    module = _encoder_in_one_storage()
    storage = module.shared.weight.untyped_storage()
    stage = LayerStage("text_encoder", module, list(module.encoder.block), "cpu", pin=False)
    try:
        assert stage.ring.in_place
        assert stage.host_storages() == {storage.data_ptr(): storage.nbytes()}  # no copy of a layer, nor of the rest
    finally:
        stage.close()


def test_layers_scattered_over_the_arena_are_copied_into_the_ring_instead():
    """A layer whose tensors lie far apart in the storage would make a slot the arena's size: packed instead."""
    module = _encoder_in_one_storage()
    first, last = module.encoder.block[0], module.encoder.block[LAYERS - 1]
    a = first.layer[1].DenseReluDense.wo.weight
    b = last.layer[1].DenseReluDense.wo.weight
    a.data, b.data = b.data, a.data  # two views of the arena swapped: the first and last layers span it all
    whole = copy.deepcopy(module)
    stage = LayerStage("text_encoder", module, list(module.encoder.block), "cpu", pin=False)
    try:
        assert not stage.ring.in_place
        stage_around(stage, module)
        ids = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            assert torch.equal(module(input_ids=ids).last_hidden_state, whole(input_ids=ids).last_hidden_state)
    finally:
        stage.close()
