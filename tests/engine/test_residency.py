"""DiT block residency is decided once (the plan) and carried out as is (the streamer).

The plan's block list and slot count are what the loaded streamer uses, and the forecast's peak
counts the slots the streamer really allocates — including a single streamed block (one slot).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_families import FAMILY_GENERATION

from omni_console.engine.engine import Engine
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.errors import PolicyError
from omni_console.offload.policy import build_policy
from omni_console.offload.residency import BlockResidency, slots_for

DEMO_BLOCKS = 6


@pytest.fixture(scope="module")
def demo_engine(demo_model_dir: Path):
    engine = Engine(demo_model_dir, device="cpu")
    yield engine
    engine.close()


@pytest.mark.slow
@pytest.mark.parametrize(("layers", "slots"), [(0, 2), (DEMO_BLOCKS - 1, 1), (DEMO_BLOCKS, 0)])
def test_streamer_carries_out_the_plans_blocks_and_slots(demo_engine: Engine, layers: int, slots: int):
    assert demo_engine.model.num_dit_blocks == DEMO_BLOCKS
    demo_engine.load(build_policy({}, layers))
    try:
        plan = demo_engine.plan
        streamer = demo_engine.placement.streamer
        assert streamer.residency is plan.residency  # handed down, not recomputed
        planned = [(f"{b.dit}.{b.attr}.{b.index}", b.streamed) for b in plan.blocks]
        loaded = [(name, state != "resident") for name, state, _ in streamer.block_states()]
        assert loaded == planned
        assert [s for _, s in planned] == [i >= layers for i in range(DEMO_BLOCKS)]  # the leading N stay
        assert streamer.num_slots == plan.residency.slots == plan.forecast.streaming_slots == slots
        assert streamer.slot_bytes == slots * streamer.largest_block_bytes
    finally:
        demo_engine.unload()


@pytest.mark.slow
@pytest.mark.parametrize("layers", [0, DEMO_BLOCKS - 1, DEMO_BLOCKS])
def test_forecast_peak_counts_the_streamers_slots(demo_engine: Engine, layers: int):
    demo_engine.load(build_policy({}, layers))
    try:
        f = demo_engine.plan.forecast
        slots = demo_engine.placement.streamer.num_slots
        model = demo_engine.model
        block_bytes = [b for dit in model.dits for bl in dit.block_lists for b in bl.block_bytes]
        largest_streamed = max(block_bytes[layers:], default=0)
        assert f.largest_streamed_block_bytes == largest_streamed
        assert f.peak_device_weight_bytes == f.device_resident_bytes + slots * largest_streamed + f.largest_staged_bytes
    finally:
        demo_engine.unload()


def test_single_streamed_block_forecasts_one_slot_not_two(demo_model_dir: Path):
    model = discover_model(demo_model_dir)
    one = make_plan(model, build_policy({}, DEMO_BLOCKS - 1)).forecast
    last_block = model.dits[-1].block_lists[-1].block_bytes[-1]
    assert one.num_streamed_blocks == 1 and one.largest_streamed_block_bytes == last_block
    assert one.peak_device_weight_bytes == one.device_resident_bytes + last_block + one.largest_staged_bytes


def test_resident_mode_streams_nothing(demo_model_dir: Path):
    plan = make_plan(discover_model(demo_model_dir), build_policy(None, 0, "resident"))
    assert plan.residency == BlockResidency.all_resident(DEMO_BLOCKS)
    assert not any(b.streamed for b in plan.blocks) and plan.forecast.streaming_slots == 0


def test_resident_layers_past_the_model_is_a_policy_error_before_residency(demo_model_dir: Path):
    with pytest.raises(PolicyError, match=r"between 0 and 6"):
        make_plan(discover_model(demo_model_dir), build_policy({}, DEMO_BLOCKS + 1))


def test_leading_residency_keeps_vllm_omni_meaning():
    r = BlockResidency.leading(4, 1)
    assert r.resident == (True, False, False, False) and r.slots == 2
    assert BlockResidency.leading(4, 3).slots == 1 and BlockResidency.leading(4, 4).slots == 0
    assert [slots_for(n) for n in range(5)] == [0, 1, 2, 2, 2]
    with pytest.raises(ValueError, match=r"resident_layers must be in \[0, 4\], got 5"):
        BlockResidency.leading(4, 5)


@pytest.mark.parametrize(("resident", "slots"), [((True, True), 1), ((False, True), 0), ((False, True), 2),
                                                 ((False, False, False), 4)])
def test_residency_refuses_a_slot_count_the_streamer_cannot_run(resident, slots):
    with pytest.raises(ValueError, match="slots"):
        BlockResidency(resident, slots)


def test_a_single_streamed_block_is_bit_identical_to_plain_diffusers(demo_model_dir: Path, demo_engine: Engine):
    """One streamed block runs through one slot (it prefetches itself); outputs stay exact."""
    import diffusers

    gen = dict(FAMILY_GENERATION["flux"])
    steps, height, width = gen.pop("num_inference_steps"), gen.pop("height"), gen.pop("width")
    req = GenerateRequest(prompt="a red fox in snow", steps=steps, height=height, width=width, seed=7, extra=gen)
    pipe = diffusers.FluxPipeline.from_pretrained(demo_model_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    expected = np.asarray(pipe(**req.call_kwargs(pipe)).images[0])
    demo_engine.load(build_policy({"default": False}, DEMO_BLOCKS - 1))
    try:
        assert demo_engine.placement.streamer.num_slots == 1
        assert np.array_equal(np.asarray(demo_engine.generate(req).image), expected)
    finally:
        demo_engine.unload()


def test_placement_refuses_loaded_blocks_that_are_not_the_plans(demo_model_dir: Path):
    """A block list that differs from the plan's would shift every residency flag: refuse it."""
    import torch

    from omni_console.engine.loading.placement import _check_block_order

    plan = make_plan(discover_model(demo_model_dir), build_policy({}, 1))
    by_list: dict[str, int] = {}
    for b in plan.blocks:
        by_list[f"{b.dit}.{b.attr}"] = by_list.get(f"{b.dit}.{b.attr}", 0) + 1
    lists = [(name, [torch.nn.Identity() for _ in range(n)]) for name, n in by_list.items()]
    _check_block_order(lists, plan)  # the plan's own blocks pass
    with pytest.raises(RuntimeError, match="differ from the plan's"):
        _check_block_order([*lists[:-1], (lists[-1][0], lists[-1][1][:-1])], plan)  # one block short
    if len(lists) > 1:  # Flux: double-stream blocks run before single-stream ones
        with pytest.raises(RuntimeError, match="differ from the plan's"):
            _check_block_order([*reversed(lists)], plan)
