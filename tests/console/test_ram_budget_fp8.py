"""fp8 storage under `--ram-budget` as `plan --json` shows it (issue 35 item 6): pinned, a block holds its fp8
bytes (half a bf16 checkpoint's; the demo's is float32); read from the page cache or disk it brings the file's
wider bytes, which the plan counts (its disk bytes, its bounce ring), so a budget is never met on paper with
bytes the run reads twice over."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from omni_console.console.cli import main
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.ram_plan import host_items
from omni_console.engine.planning.tier_plan import smallest_peak
from omni_console.offload.policy import build_policy
from omni_console.offload.tiers import bounce_ring_bytes

PLAN = ["plan", "--device", "cpu", "--height", "64", "--width", "64", "--json"]
FP8 = ["--stream-dtype", "float8_e4m3fn"]


@pytest.fixture(scope="module")
def long_model(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model with 24 single blocks: more blocks than the bounce ring's slots, so file tiers can pay."""
    import torch
    from diffusers import FluxTransformer2DModel

    root = tmp_path_factory.mktemp("long") / "flux"
    shutil.copytree(demo_model_dir, root)
    config = FluxTransformer2DModel.load_config(root / "transformer")
    torch.manual_seed(0)
    FluxTransformer2DModel.from_config({**config, "num_single_layers": 24}).save_pretrained(root / "transformer")
    return root


def _ram_plan(model: Path, capsys, *extra: str) -> dict:
    assert main([*PLAN, "--model", str(model), *extra]) == 0
    return json.loads(capsys.readouterr().out)["ram_plan"]


@pytest.mark.slow
def test_fp8_storage_halves_the_pinned_host_bytes_and_file_tiers_read_the_files_bytes(long_model: Path, capsys):
    plan = make_plan(discover_model(long_model), build_policy({}, 0, stream_dtype="float8_e4m3fn"))
    streamed = [b for b in plan.blocks if b.streamed]
    stored, in_files = sum(b.nbytes for b in streamed), sum(b.read_nbytes for b in streamed)
    assert stored < 0.6 * in_files  # the linears in one byte, the 16-bit file's norms and biases as they are
    roomy = ["--ram-budget", "64GB"]
    full, fp8 = _ram_plan(long_model, capsys, *roomy), _ram_plan(long_model, capsys, *roomy, *FP8)
    assert full["block_tiers"] == fp8["block_tiers"] == []  # all pinned
    assert fp8["pinned_bytes"] - full["pinned_bytes"] == stored - in_files  # the blocks' bytes, about halved
    assert fp8["host_peak_bytes"] < full["host_peak_bytes"]
    # a budget below the blocks: the ones read from disk count the file's bytes, and the ring holds a file read
    items, _ = host_items(plan)
    budget = smallest_peak(items, fp8["fixed_host_bytes"]) + max(b.nbytes for b in streamed)
    tight = _ram_plan(long_model, capsys, "--ram-budget", f"{budget}B", *FP8)
    on_disk = [b for b, t in zip(plan.blocks, tight["block_tiers"], strict=True) if t == "disk"]
    sizes = {c.info.name: c.info.nbytes for c in plan.components}
    staged_on_disk = [sizes[n] for n, t in tight["component_tiers"].items() if t == "disk"]  # a staged one: its bytes
    blocks_on_disk = tight["disk_bytes"] - sum(staged_on_disk)
    assert on_disk and blocks_on_disk == sum(b.read_nbytes for b in on_disk) > sum(b.nbytes for b in on_disk)
    staged_chunks = [i.slot_basis for i, k in zip(*host_items(plan), strict=True)
                     if k[0] == "component" and tight["component_tiers"][k[1]] != "pinned"]
    assert tight["bounce_ring_bytes"] == bounce_ring_bytes(max(b.read_nbytes for b in on_disk)) + (
        bounce_ring_bytes(max(staged_chunks)) if staged_chunks else 0)  # the streamer's ring, the staged ones'
    assert tight["host_peak_bytes"] <= budget
