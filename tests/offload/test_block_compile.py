"""Regional compile of streamed blocks on CPU: no recompile after warm-up, hooks outside the graph, and the
same output as diffusers' own `compile_repeated_blocks` on the resident model (backends eager, aot_eager)."""

from __future__ import annotations

import copy

import pytest
import torch
from diffusers import FluxTransformer2DModel, WanTransformer3DModel

from omni_console.offload.block_compile import CompiledBlocks, CompileSettings, CompileWatch, repeated_blocks
from omni_console.offload.residency import BlockResidency
from omni_console.offload.streamer import LayerwiseStreamer


def _flux() -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=3,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=32, axes_dims_rope=(4, 6, 6)).eval()
    g = torch.Generator().manual_seed(1)
    inputs = {"hidden_states": torch.randn(1, 16, 16, generator=g),
              "encoder_hidden_states": torch.randn(1, 8, 32, generator=g),
              "pooled_projections": torch.randn(1, 32, generator=g), "timestep": torch.tensor([0.5]),
              "img_ids": torch.zeros(16, 3), "txt_ids": torch.zeros(8, 3), "return_dict": False}
    return model, inputs


def _wan() -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(0)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
                                  out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=3,
                                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32).eval()
    g = torch.Generator().manual_seed(1)
    inputs = {"hidden_states": torch.randn(1, 4, 2, 8, 8, generator=g),
              "encoder_hidden_states": torch.randn(1, 8, 32, generator=g),
              "timestep": torch.tensor([500]), "return_dict": False}
    return model, inputs


def _block_lists(model: torch.nn.Module) -> list[tuple[str, list[torch.nn.Module]]]:
    names = [n for n in ("transformer_blocks", "single_transformer_blocks", "blocks") if hasattr(model, n)]
    return [(n, list(getattr(model, n))) for n in names]


def _streamed(model: torch.nn.Module, slots: int = 2) -> LayerwiseStreamer:
    lists = _block_lists(model)
    n = sum(len(m) for _, m in lists)
    streamer = LayerwiseStreamer(lists, "cpu", residency=BlockResidency(resident=(False,) * n, slots=slots))
    streamer.attach()
    return streamer


def _step_inputs(inputs: dict, step: int) -> dict:
    """Each step another timestep, as a scheduler gives (same shapes)."""
    return {**inputs, "timestep": inputs["timestep"] * (1.0 - 0.1 * step)}


@pytest.mark.parametrize("make", [_flux, _wan], ids=["flux", "wan"])
@pytest.mark.parametrize("backend", ["eager", pytest.param("aot_eager", marks=pytest.mark.slow)])
def test_streamed_blocks_compile_once_and_match_diffusers_regional_compile(make, backend):
    reference, inputs = make()
    model = copy.deepcopy(reference)
    settings = CompileSettings(backend=backend)
    reference.compile_repeated_blocks(backend=backend, fullgraph=True, dynamic=False)
    streamer = _streamed(model)
    compiled = CompiledBlocks(repeated_blocks(model), settings)
    assert compiled.class_names == sorted(set(reference._repeated_blocks) & set(compiled.class_names))
    with torch.no_grad():
        expected = [reference(**_step_inputs(inputs, s))[0] for s in range(4)]
        got = [model(**_step_inputs(inputs, 0))[0]]  # warm-up: the first call per block class and shape
        warm = CompileWatch.snapshot()
        got += [model(**_step_inputs(inputs, s))[0] for s in range(1, 4)]
    after = CompileWatch.snapshot() - warm
    assert after.compiles == 0 and after.recompiles == 0, after
    assert after.graph_breaks == 0
    assert compiled.fullgraph_classes == compiled.class_names
    for e, g in zip(expected, got, strict=True):
        assert torch.equal(e, g)
    assert streamer.num_streamed == sum(len(m) for _, m in _block_lists(model))
    streamer.detach()
    compiled.remove()


def test_the_ring_hooks_run_eagerly_at_each_block_boundary():
    """The hooks are not traced: they run at every call of every block, also once the graphs are warm."""
    model, inputs = _flux()
    streamer = _streamed(model)
    compiled = CompiledBlocks(repeated_blocks(model), CompileSettings(backend="eager"))
    calls: list[str] = []
    blocks = repeated_blocks(model)
    for i, b in enumerate(blocks):
        b.register_forward_pre_hook(lambda _m, _a, i=i: calls.append(f"pre{i}"))
    with torch.no_grad():
        for s in range(3):
            model(**_step_inputs(inputs, s))
    assert calls == [f"pre{i}" for i in range(len(blocks))] * 3
    # a block that ran is a placeholder again (the ring's post-hook ran outside the graph)
    assert any(p.numel() == 0 for b in blocks for p in b.parameters())
    streamer.detach()
    compiled.remove()


def test_remove_restores_the_eager_forward():
    model, inputs = _flux()
    blocks = repeated_blocks(model)
    compiled = CompiledBlocks(blocks, CompileSettings(backend="eager"))
    assert all("forward" in vars(b) for b in blocks)
    compiled.remove()
    assert not any("forward" in vars(b) for b in blocks)
    before = CompileWatch.snapshot()
    with torch.no_grad():
        model(**inputs)
    assert (CompileWatch.snapshot() - before).compiles == 0


def test_a_block_list_without_repeated_blocks_falls_back_to_the_given_blocks():
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    assert repeated_blocks(plain, list(plain)) == list(plain)


def test_a_shape_change_compiles_again_and_is_counted():
    model, inputs = _flux()
    compiled = CompiledBlocks(repeated_blocks(model), CompileSettings(backend="eager"))
    with torch.no_grad():
        model(**inputs)
        before = CompileWatch.snapshot()
        bigger = {**inputs, "hidden_states": torch.randn(1, 32, 16), "img_ids": torch.zeros(32, 3)}
        model(**bigger)
    assert (CompileWatch.snapshot() - before).recompiles > 0
    compiled.remove()


def test_an_out_of_memory_while_compiling_reaches_the_caller_as_the_oom_it_is():
    """Inductor wraps a failure in its backend (autotuning out of device memory) in BackendCompilerFailed; the
    request's OOM guard steps down on `torch.OutOfMemoryError`, so the OOM is what comes out."""

    def failing_backend(gm, example_inputs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    model, inputs = _flux()
    compiled = CompiledBlocks(repeated_blocks(model), CompileSettings(backend=failing_backend))
    with torch.no_grad(), pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        model(**inputs)
    compiled.remove()


def test_past_dynamos_recompile_limit_a_block_runs_eager_instead_of_failing(monkeypatch):
    """A long session of many sizes can pass the limit; the request must go on (eager for those calls)."""
    import torch._dynamo.config as dynamo_config

    from omni_console.offload import block_compile

    model, inputs = _flux()
    monkeypatch.setattr(block_compile, "RECOMPILE_LIMIT", 1)
    monkeypatch.setattr(dynamo_config, "recompile_limit", 1)
    torch._dynamo.reset()  # this test's limit counts from here
    sizes = [{**inputs, "hidden_states": torch.randn(1, n, 16), "img_ids": torch.zeros(n, 3)} for n in (16, 24, 32)]
    with torch.no_grad():
        expected = [model(**sized)[0] for sized in sizes]
        compiled = CompiledBlocks(repeated_blocks(model), CompileSettings(backend="eager"))
        got = [model(**sized)[0] for sized in sizes]  # a new shape each: past a limit of one graph per class
    assert compiled.eager_calls > 0
    for e, g in zip(expected, got, strict=True):
        assert torch.equal(e, g)
    compiled.remove()
    torch._dynamo.reset()



def test_the_counts_go_on_after_torch_dynamo_reset():
    """`torch._dynamo.reset()` clears every compile callback; the next `CompiledBlocks` installs ours again."""
    model, inputs = _flux()
    CompileWatch.watch()  # installed before the reset
    torch._dynamo.reset()
    compiled = CompiledBlocks(repeated_blocks(model), CompileSettings(backend="eager"))
    before = CompileWatch.snapshot()
    with torch.no_grad():
        model(**inputs)
    assert (CompileWatch.snapshot() - before).compiles > 0
    compiled.remove()
    torch._dynamo.reset()


def test_a_size_one_dimension_stride_is_made_contiguous_without_a_copy():
    from omni_console.offload.block_compile import _unit_strides

    joint = torch.randn(1, 10, 4)
    image = joint[:, 4:]  # batch stride 40, as Flux's single blocks hand each other
    same = _unit_strides(image)
    assert image.stride() == (40, 4, 1) and same.stride() == (24, 4, 1)
    assert same.untyped_storage().data_ptr() == joint.untyped_storage().data_ptr()
    assert same.storage_offset() == image.storage_offset() and torch.equal(same, image)
    plain = torch.randn(1, 6, 4)
    assert _unit_strides(plain) is plain  # nothing to change: the tensor itself
    pair = (plain, image)
    assert _unit_strides(pair)[0] is plain and _unit_strides(pair)[1].stride() == (24, 4, 1)
    assert _unit_strides((plain, 3)) == (plain, 3) and _unit_strides("x") == "x"
    column = torch.randn(4, 6)[:, :1]  # size-1 last dimension: stride 6 -> 1
    assert _unit_strides(column).stride() == (6, 1) and torch.equal(_unit_strides(column), column)


def test_flux_single_blocks_fed_slices_share_the_graph_of_contiguous_input():
    """The first single block gets contiguous tensors, every later one slices of the joint sequence: one graph per
    class (not a second for the slices' batch stride), so a cold start compiles and a warm one loads one fewer."""
    model, inputs = _flux()
    torch._dynamo.reset()
    compiled = CompiledBlocks(repeated_blocks(model), CompileSettings(backend="eager"))
    before = CompileWatch.snapshot()
    with torch.no_grad():
        got = model(**inputs)[0]
    done = CompileWatch.snapshot() - before
    assert done.compiles == len(compiled.class_names) == 2 and done.recompiles == 0, done
    compiled.remove()
    with torch.no_grad():
        assert torch.equal(got, model(**inputs)[0])
    torch._dynamo.reset()
