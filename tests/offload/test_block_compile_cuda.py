"""Regional compile of streamed blocks on the GPU with Inductor: bit-identical to diffusers' own
`compile_repeated_blocks` of the resident model (the same graphs, the same kernels), no recompile after warm-up
through 2 slots and a re-plan, and the compiled output's difference from eager measured (not zero: not asserted)."""

from __future__ import annotations

import copy

import pytest
import torch
from test_block_compile import _block_lists, _flux, _step_inputs, _wan

from omni_console.offload.block_compile import CompiledBlocks, CompileSettings, CompileWatch, repeated_blocks
from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]
DEV = torch.device("cuda", 0)


def _on_gpu(inputs: dict) -> dict:
    return {k: v.to(DEV, torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() else
            (v.to(DEV) if torch.is_tensor(v) else v) for k, v in inputs.items()}


@pytest.mark.parametrize("make", [_flux, _wan], ids=["flux", "wan"])
def test_streamed_inductor_blocks_equal_diffusers_regional_compile_on_the_gpu(make):
    reference, inputs = make()
    reference = reference.to(DEV, torch.bfloat16)
    model = copy.deepcopy(reference).cpu()
    inputs = _on_gpu(inputs)
    with torch.no_grad():
        eager = reference(**inputs)[0]
    reference.compile_repeated_blocks(fullgraph=True, dynamic=False)
    lists = _block_lists(model)
    n = sum(len(m) for _, m in lists)
    for name, child in model.named_children():
        if name not in {lst for lst, _ in lists}:
            child.to(DEV)
    streamer = LayerwiseStreamer(lists, DEV, residency=BlockResidency(resident=(False,) * n, slots=2),
                                 keep_masters=True)
    streamer.attach()
    compiled = CompiledBlocks(repeated_blocks(model), CompileSettings())
    try:
        with torch.no_grad():
            expected = [reference(**_step_inputs(inputs, s))[0] for s in range(3)]
            got = [model(**_step_inputs(inputs, 0))[0]]
            torch.cuda.synchronize()
            warm = CompileWatch.snapshot()
            got.append(model(**_step_inputs(inputs, 1))[0])
            streamer.replan(BlockResidency.leading(n, 1, 2))  # a re-plan: one block resident, the ring rebuilt
            got.append(model(**_step_inputs(inputs, 2))[0])
            torch.cuda.synchronize()
        after = CompileWatch.snapshot() - warm
        assert (after.compiles, after.recompiles) == (0, 0), after
        for e, g in zip(expected, got, strict=True):
            assert torch.equal(e, g)
        diff = float((expected[0].float() - eager.float()).abs().max())
        print(f"max |compiled - eager| = {diff:.3g}")
    finally:
        compiled.remove()
        streamer.detach()
