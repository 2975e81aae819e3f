"""`--ram-budget` on a real plan (the demo model): what the host keeps, fp8 storage's halved bytes, live re-plan
masters, and the tiers as `HostTiers` indexes them."""

from __future__ import annotations

import dataclasses
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
    staged = [c.info.name for c in plan.components if c.residency == "staged" and c.info.has_weights]
    assert staged  # the encoders and the VAE: each may be read from its files at each stage
    assert keys == [("block", n) for n in streamed] + [("component", name) for name in staged]  # not the resident block
    assert [i.hot for i in items] == [True] * len(streamed) + [False] * len(staged)
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


def test_two_experts_offer_every_block_of_both_each_read_by_its_own_experts_forwards(tmp_path: Path):
    from tiny_families_experts import build_tiny_wan22_a14b

    plan = make_plan(discover_model(build_tiny_wan22_a14b(tmp_path / "wan22")), build_policy({"default": True}, 1))
    per = plan.experts[0].count
    items, keys = host_items(plan)
    staged = [("component", c.info.name) for c in plan.components if c.residency == "staged" and c.info.has_weights]
    # HostTiers: the first expert's blocks, then the second's; the staged encoders/VAEs after them
    assert keys == [("block", n) for n in range(len(plan.blocks))] + staged
    items = items[:len(plan.blocks)]
    assert [i.forward for i in items] == [0] * per + [1] * per
    # the resident ones are cold (read once at each switch to their expert), and read whole through one slot
    assert [i.hot for i in items] == [b.streamed for b in plan.blocks] and not all(i.hot for i in items)
    assert all(i.whole for i in items if not i.hot)
    all_items, _ = host_items(plan)
    assert sum(i.nbytes for i in all_items) + fixed_host_bytes(plan) == host_forecast(plan).peak_bytes
    # a budget that cannot hold both experts pinned: the blocks that stay pinned are fewer than one expert's
    fixed = fixed_host_bytes(plan)
    largest = max(i.nbytes for i in items)
    budget = smallest_peak(all_items, fixed) + largest
    chosen = ram_plan(plan, budget, RATES, cap=budget)
    pinned = [n for n in range(len(plan.blocks)) if chosen.tiers.block(n) == "pinned"]
    assert len(pinned) < per and chosen.choice.cost.host_peak_bytes <= budget
    # the forecast the run is checked against counts the bounce ring, not the blocks in files
    tiered = host_forecast(dataclasses.replace(plan, tiers=chosen.tiers))
    assert tiered.part("pinned blocks") == sum(plan.blocks[n].nbytes for n in pinned)
    assert tiered.part("bounce ring") == chosen.choice.cost.ring_bytes
    lines = [line for line in chosen.reasons if "expert) DiT blocks" in line]
    assert [line.split(" ")[0] for line in lines] == ["transformer", "transformer_2"]
    cold_in_files = [n for n, i in enumerate(items) if not i.hot and chosen.tiers.block(n) != "pinned"]
    switch = [line for line in chosen.reasons if line.startswith("a switch to transformer_2 reads its")]
    assert bool(switch) == any(items[n].forward == 1 for n in cold_in_files) and switch  # read at the switch, said
