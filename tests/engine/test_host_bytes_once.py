"""Every weight's bytes are held once on the host: an encoder streamed layer by layer reads its layers in
place from the arena it was built over (it used to copy them into its ring's arena as well: 9.26 GB extra
on a Flux-size T5), and a staged master that is a copy frees the arena it was copied from. The host arenas
a load holds stay within the plan's pinned figure plus their alignment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_families import write_wide_wan

from omni_console.engine.engine import Engine
from omni_console.engine.options import EngineOptions
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.layer_stage import LayerStage
from omni_console.offload.pinned import PAGE, arena_bytes_held
from omni_console.offload.policy import build_policy


@pytest.fixture(scope="module")
def wide_wan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Wan pipeline with a UMT5 whose layers are most of its bytes (so a second copy shows)."""
    return write_wide_wan(tmp_path_factory.mktemp("once") / "wan", d_ff=1024)


REQUEST = GenerateRequest(prompt="a red fox in snow", steps=2, height=32, width=32, seed=7,
                          extra={"num_frames": 5, "max_sequence_length": 32})


def _alignment_bound(engine: Engine) -> int:
    """What arenas may add to the plan's bytes: a page per tensor at most (a CPU arena keeps each tensor's
    file phase; CUDA arenas align to 256 bytes)."""
    modules = [getattr(engine.pipe, c.info.name, None) for c in engine.plan.components]
    count = sum(len(m.state_dict()) for m in modules if isinstance(m, torch.nn.Module))
    return count * PAGE


@pytest.mark.slow
def test_a_streamed_encoder_built_over_an_arena_holds_its_layers_once(wide_wan: Path, wan_loadable) -> None:
    import diffusers

    pipe = diffusers.WanPipeline.from_pretrained(wide_wan, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    expected = np.asarray(pipe(**REQUEST.call_kwargs(pipe)).frames[0][0])
    base = arena_bytes_held()
    engine = Engine(wide_wan, device="cpu", options=EngineOptions(aux_in_place=True))
    try:
        engine.load(build_policy({}, 0, stream_encoders="on"))
        stage = engine.placement.stagers["text_encoder"]
        assert isinstance(stage, LayerStage) and stage.ring.in_place
        encoder = engine.plan.model.component("text_encoder")
        assert encoder.layers is not None and encoder.layers.total_bytes > encoder.nbytes / 2
        held_by_encoder = sum(stage.host_storages().values())
        assert held_by_encoder < encoder.nbytes + encoder.layers.total_bytes / 2  # one copy, not two
        held = arena_bytes_held() - base
        planned = engine.plan.forecast.pinned_host_bytes
        assert planned <= held <= planned + _alignment_bound(engine)
        assert held < planned + encoder.layers.total_bytes / 2
        for _ in range(2):  # the second prompt reads the layers from the arena again
            assert np.array_equal(np.asarray(engine.generate(REQUEST).image), expected)
    finally:
        engine.close()
    assert arena_bytes_held() == base  # all released


@pytest.mark.slow
def test_a_staged_master_that_is_a_copy_frees_the_arena_it_was_read_into(wide_wan: Path, wan_loadable) -> None:
    """On a CPU nothing is page-locked, so a staged encoder's master is a copy in the stager's own arena:
    the arena the encoder was read into is closed at once, not held beside it until release."""
    base = arena_bytes_held()
    engine = Engine(wide_wan, device="cpu", options=EngineOptions(aux_in_place=True))
    try:
        engine.load(build_policy({}, 0, stream_encoders="off"))
        held = arena_bytes_held() - base
        planned = engine.plan.forecast.pinned_host_bytes
        encoder = engine.plan.model.component("text_encoder")
        assert planned <= held < planned + encoder.nbytes / 2
    finally:
        engine.close()
    assert arena_bytes_held() == base


@pytest.mark.slow
@pytest.mark.parametrize("policy", [dict(components={}, resident_layers=0),
                                    dict(components={"default": False}, resident_layers=1),
                                    dict(components={}, resident_layers=1, placement="spread"),
                                    dict(components={}, resident_layers=0, stream_encoders="on")],
                         ids=["staged", "resident-aux", "spread", "streamed-encoders"])
def test_loads_from_arenas_run_as_diffusers_under_every_policy(wide_wan: Path, wan_loadable, policy: dict) -> None:
    import diffusers

    pipe = diffusers.WanPipeline.from_pretrained(wide_wan, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    expected = np.asarray(pipe(**REQUEST.call_kwargs(pipe)).frames[0][0])
    base = arena_bytes_held()
    engine = Engine(wide_wan, device="cpu", options=EngineOptions(aux_in_place=True))
    try:
        args = dict(policy)
        engine.load(build_policy(args.pop("components"), args.pop("resident_layers"), **args))
        planned = engine.plan.forecast.pinned_host_bytes
        assert planned <= arena_bytes_held() - base <= planned + _alignment_bound(engine)
        assert np.array_equal(np.asarray(engine.generate(REQUEST).image), expected)
    finally:
        engine.close()
