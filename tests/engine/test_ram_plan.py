"""`--ram-budget` on a real plan (the demo model): what the host keeps, fp8 storage's halved bytes, live re-plan
masters, and the tiers as `HostTiers` indexes them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.host_forecast import host_forecast
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.ram_plan import fixed_host_bytes, host_items, ram_plan
from omni_console.engine.planning.tier_plan import NothingFitsHost, smallest_peak
from omni_console.offload.policy import build_policy
from omni_console.offload.tiers import TierRates

RATES = TierRates(link=20e9, page_cache=4e9, disk=2e9)


@pytest.fixture(scope="module")
def model(demo_model_dir: Path):
    return discover_model(demo_model_dir)


@pytest.fixture(scope="module")
def long_model(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The demo model with 24 single blocks: more blocks than the bounce ring's 4 slots, so file tiers can pay."""
    import torch
    from diffusers import FluxTransformer2DModel

    root = tmp_path_factory.mktemp("long") / "flux"
    shutil.copytree(demo_model_dir, root)
    config = FluxTransformer2DModel.load_config(root / "transformer")
    torch.manual_seed(0)
    FluxTransformer2DModel.from_config({**config, "num_single_layers": 24}).save_pretrained(root / "transformer")
    return discover_model(root)


def test_the_host_items_are_the_streamed_blocks_and_the_rest_is_the_host_forecast(model):
    plan = make_plan(model, build_policy({"default": True}, 1))
    items, keys = host_items(plan)
    streamed = [n for n, b in enumerate(plan.blocks) if b.streamed]
    assert keys == [("block", n) for n in streamed]  # the resident block is not; staged masters stay pinned
    assert sum(i.nbytes for i in items) + fixed_host_bytes(plan) == host_forecast(plan).peak_bytes


def test_live_replan_masters_of_every_block_are_file_tier_candidates_the_resident_ones_cold(model):
    plan = make_plan(model, build_policy({"default": False}, 1))  # nothing staged, one block resident
    items, keys = host_items(plan, live=True)
    assert keys == [("block", n) for n in range(len(plan.blocks))]
    assert [i.hot for i in items] == [b.streamed for b in plan.blocks]  # a resident block is read only by a re-plan
    blocks = host_forecast(plan, live_replan=True).part("pinned blocks")
    assert blocks == sum(i.nbytes for i in items) == plan.forecast.pinned_host_bytes_live \
        - sum(c.info.nbytes for c in plan.components if c.info.role in ("encoder", "vae") and c.info.has_weights)
    assert fixed_host_bytes(plan, live=True) + blocks == host_forecast(plan, live_replan=True).peak_bytes


def test_a_tight_budget_reads_blocks_from_files_and_the_tiers_index_plan_blocks(long_model):
    plan = make_plan(long_model, build_policy({"default": True}, 0))
    items, _ = host_items(plan)
    fixed = fixed_host_bytes(plan)
    largest = max(b.nbytes for b in plan.blocks)
    budget = smallest_peak(items, fixed) + largest  # room for the ring and about one pinned block
    chosen = ram_plan(plan, budget, RATES, cap=budget)  # the default cap is a share of the budget: tiny here
    assert len(chosen.tiers.blocks) == len(plan.blocks)
    assert any(chosen.tiers.block(n) != "pinned" for n in range(len(plan.blocks)))
    assert chosen.choice.cost.host_peak_bytes <= budget
    assert any("from disk" in line or "from the page cache" in line for line in chosen.reasons)
    roomy = ram_plan(plan, fixed + sum(i.nbytes for i in items) * 2, RATES, cap=budget * 9)
    assert roomy.tiers.all_pinned and roomy.choice.cost.ring_bytes == 0
    with pytest.raises(NothingFitsHost, match="smallest possible host peak"):
        ram_plan(plan, fixed, RATES, cap=budget)


def test_fp8_storage_halves_the_blocks_host_bytes_and_the_planner_counts_it(long_model):
    model = long_model
    plain = make_plan(model, build_policy({"default": True}, 0))
    fp8 = make_plan(model, build_policy({"default": True}, 0, stream_dtype="float8_e4m3fn"))
    plain_blocks = sum(i.nbytes for i, k in zip(*host_items(plain), strict=True) if k[0] == "block")
    fp8_blocks = sum(i.nbytes for i, k in zip(*host_items(fp8), strict=True) if k[0] == "block")
    assert fp8_blocks < 0.6 * plain_blocks  # the linears' weights in one byte (norms and biases stay)
    # a budget that holds the fp8 blocks pinned, not the 16-bit ones
    masters = sum(i.nbytes for i, k in zip(*host_items(fp8), strict=True) if k[0] == "component")
    budget = fixed_host_bytes(fp8) + masters + fp8_blocks
    assert ram_plan(fp8, budget, RATES, cap=budget).tiers.all_pinned
    assert not ram_plan(plain, budget, RATES, cap=budget).tiers.all_pinned
    assert any("half the host bytes" in line for line in ram_plan(fp8, budget, RATES, cap=budget).reasons)


def test_two_experts_keep_every_block_pinned_until_the_runtime_reads_them_from_files(tmp_path: Path):
    from tiny_families_experts import build_tiny_wan22_a14b

    plan = make_plan(discover_model(build_tiny_wan22_a14b(tmp_path / "wan22")), build_policy({"default": True}, 1))
    items, _ = host_items(plan)
    assert items == []  # offload/tier_support.py: two experts keep pinned masters
    assert fixed_host_bytes(plan) == host_forecast(plan).peak_bytes
    assert host_forecast(plan).part("pinned blocks") == sum(b.nbytes for b in plan.blocks)
