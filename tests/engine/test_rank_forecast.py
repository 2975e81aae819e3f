"""Per-rank forecast of `--gpus N`: AllGather shards (ceil(block / N), zero-padded), rank-local whole blocks,
the device peak's shard buffers, PCIe and NVLink bytes and the step floor — each checked against sums
worked out by hand on small synthetic models."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_console.engine.model_dir.blocks import BlockList
from omni_console.engine.model_dir.discovery import ComponentInfo, ModelInfo
from omni_console.engine.planning.plan import Plan, make_plan
from omni_console.engine.planning.request_forecast import forecast_request
from omni_console.engine.planning.request_profile import RequestSize
from omni_console.engine.planning.stream_choice import DitProfile
from omni_console.engine.ranks.rank_forecast import NVLINK_BYTES_PER_S, rank_forecast, shard_sizes
from omni_console.engine.ranks.rank_layout import RankLayout
from omni_console.offload.policy import build_policy

NON_BLOCK = 100


def synthetic_plan(block_bytes: Sequence[int], staged: Sequence[int] = (), resident_layers: int = 0,
                   slots: int = 2) -> Plan:
    """A model of one DiT with these block sizes and one staged encoder per entry of `staged` (no files read)."""
    root = Path("/nonexistent/model")
    dit = ComponentInfo("transformer", "dit", "diffusers", "FluxTransformer2DModel", root / "transformer",
                        files=(root / "transformer/w.safetensors",), nbytes=sum(block_bytes) + NON_BLOCK,
                        block_lists=(BlockList("transformer_blocks", tuple(block_bytes)),))
    encoders = tuple(ComponentInfo(f"text_encoder_{i}", "encoder", "transformers", "CLIPTextModel",
                                   root / f"text_encoder_{i}", files=(root / f"text_encoder_{i}/w.safetensors",),
                                   nbytes=nbytes) for i, nbytes in enumerate(staged))
    model = ModelInfo(root, "FluxPipeline", (dit, *encoders))
    return make_plan(model, build_policy(None, resident_layers, "dlo", "leading", slots))


def test_seed_examples_shard_sizes():
    assert shard_sizes([8], 4) == [2]  # 8 bytes over 4 ranks: 2 each, no padding
    assert shard_sizes([3], 2) == [2]  # 3 over 2: ceil 2, the second rank's shard has 1 byte of padding
    assert shard_sizes([8, 3, 1], 2) == [4, 2, 1]


def test_eight_bytes_over_four_ranks():
    r = rank_forecast(synthetic_plan([8]), RankLayout(4))
    assert (r.streamed_pinned_bytes, r.padding_bytes) == (2, 0)
    assert (r.pcie_bytes_per_forward, r.nvlink_bytes_per_forward) == (2, 6)
    assert r.requests_at_once == 4 and r.pinned_host_bytes_all_ranks == 8


def test_three_bytes_over_two_ranks_pads_one():
    r = rank_forecast(synthetic_plan([3]), RankLayout(2))
    assert (r.streamed_pinned_bytes, r.padding_bytes) == (2, 1)
    assert (r.pcie_bytes_per_forward, r.nvlink_bytes_per_forward) == (2, 2)


def test_allgather_with_a_resident_block_and_a_staged_encoder():
    # blocks 10 (resident: leading), 7 and 4 streamed; one staged encoder of 50 bytes; 3 ranks, ring of 2
    plan = synthetic_plan([10, 7, 4], staged=[50], resident_layers=1)
    single_peak = NON_BLOCK + 10 + 2 * 7 + 50  # resident + 2 slots x largest streamed + largest staged
    assert plan.forecast.peak_device_weight_bytes == single_peak
    r = rank_forecast(plan, RankLayout(3))
    assert r.streamed_pinned_bytes == 3 + 2  # ceil(7/3) + ceil(4/3)
    assert r.padding_bytes == 3 * 5 - 11
    assert (r.staged_pinned_bytes, r.pinned_host_bytes, r.pinned_host_bytes_all_ranks) == (50, 55, 165)
    assert r.shard_buffer_bytes == 2 * 3  # two buffers of the largest shard
    assert r.device_peak_bytes == single_peak + 2 * 3 + 2 * (9 - 7)  # + buffers + each slot's gathered padding
    assert (r.pcie_bytes_per_forward, r.nvlink_bytes_per_forward) == (5, 10)
    assert any(n.startswith("resident layers with AllGather: allowed here") and "TP-aware loader" in n
               for n in r.notes)
    assert any("staged rank-locally" in n for n in r.notes)


def test_rank_local_is_the_single_gpu_plan_on_every_rank():
    plan = synthetic_plan([10, 7, 4], staged=[50], resident_layers=1)
    r = rank_forecast(plan, RankLayout(3, allgather=False))
    assert r.pinned_host_bytes == plan.forecast.pinned_host_bytes == 7 + 4 + 50
    assert r.device_peak_bytes == plan.forecast.peak_device_weight_bytes
    assert (r.pcie_bytes_per_forward, r.nvlink_bytes_per_forward, r.padding_bytes) == (11, 0, 0)
    assert r.shard_buffer_bytes == 0 and not any("AllGather" in n for n in r.notes)


def _profile(plan: Plan, forwards_per_step: int) -> DitProfile:
    blocks = tuple(b.nbytes for b in plan.blocks)
    return DitProfile(blocks, (0.01,) * len(blocks), 0.005, forwards_per_step, 0)


def test_step_floor_when_the_copy_and_gather_dominate():
    plan = synthetic_plan([1000, 1000])
    request = forecast_request(plan, RequestSize(), None, "unknown", 1000.0, "estimated")
    r = rank_forecast(plan, RankLayout(2), request, _profile(plan, 2), nvlink_bandwidth=500.0)
    # per forward: copy 1000 B at 1000 B/s = 1 s, gather 1000 B at 500 B/s = 2 s; compute 0.025 s; 2 forwards
    assert r.step_floor_s == pytest.approx(2 * 3.0)
    assert r.compute_s_per_step == pytest.approx(2 * 0.025)
    assert r.step_floor_source == "estimated" and r.nvlink_bandwidth == 500.0


def test_step_floor_when_compute_dominates_and_cfg_runs_one_branch_per_rank():
    plan = synthetic_plan([1000, 1000])
    request = forecast_request(plan, RequestSize(), None, "unknown", 1e6, "estimated")
    dp = rank_forecast(plan, RankLayout(2), request, _profile(plan, 2))
    assert dp.step_floor_s == pytest.approx(2 * 0.025)  # 1000 B / 1 MB/s + 1000 B / 0.26 TB/s < 0.025 s
    assert dp.nvlink_bandwidth == NVLINK_BYTES_PER_S and dp.gather_link == "NVLink"
    cfg = rank_forecast(plan, RankLayout(2, parallel="cfg"), request, _profile(plan, 2))
    assert cfg.forwards_per_step == 1 and cfg.step_floor_s == pytest.approx(0.025)
    assert (dp.requests_at_once, cfg.requests_at_once) == (2, 1)


def test_step_floor_is_unknown_without_a_profile_or_a_gather_rate():
    plan = synthetic_plan([1000, 1000])
    request = forecast_request(plan, RequestSize(), None, "unknown", 1e6, "estimated")
    r = rank_forecast(plan, RankLayout(2), request, None)
    assert (r.step_floor_s, r.step_floor_source, r.compute_s_per_step) == (None, "unknown", None)
    cpu = rank_forecast(plan, RankLayout(2), request, _profile(plan, 1), cpu=True)
    assert cpu.step_floor_s is None and cpu.gather_link == "gloo" and cpu.nvlink_bandwidth is None
    # rank-local on a CPU: no gather; copies do not overlap compute, so they add up
    local = rank_forecast(plan, RankLayout(2, allgather=False), request, _profile(plan, 1), cpu=True)
    assert local.step_floor_s == pytest.approx(0.025 + 2000 / 1e6)


@settings(max_examples=150, deadline=None)
@given(blocks=st.lists(st.integers(1, 10**9), min_size=1, max_size=24), gpus=st.integers(2, 16),
       staged=st.lists(st.integers(1, 10**9), max_size=3), data=st.data())
def test_shards_cover_every_streamed_byte_with_bounded_padding(blocks, gpus, staged, data):
    resident = data.draw(st.integers(0, len(blocks)))
    plan = synthetic_plan(blocks, staged=staged, resident_layers=resident)
    streamed = [b.nbytes for b in plan.blocks if b.streamed]
    r = rank_forecast(plan, RankLayout(gpus))
    # every streamed byte is pinned on some rank; padding is under one element per rank per block
    assert r.streamed_pinned_bytes * gpus >= sum(streamed)
    assert r.streamed_pinned_bytes * gpus - sum(streamed) == r.padding_bytes <= (gpus - 1) * len(streamed)
    assert r.pinned_host_bytes == r.streamed_pinned_bytes + sum(staged)
    assert abs(r.pcie_bytes_per_forward - sum(streamed) / gpus) < len(streamed) or not streamed
    assert r.pcie_bytes_per_forward + r.nvlink_bytes_per_forward >= sum(streamed)
    assert r.device_peak_bytes >= plan.forecast.peak_device_weight_bytes
    local = rank_forecast(plan, RankLayout(gpus, allgather=False))
    assert local.pinned_host_bytes == plan.forecast.pinned_host_bytes >= r.pinned_host_bytes
