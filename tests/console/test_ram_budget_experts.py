"""`run --ram-budget` on a two-expert Wan 2.2 A14B end to end (issue 35 item 5): a budget that holds less than
one expert's blocks pinned runs with the rest read from disk, the report's `ram_plan` says where each expert's
blocks live, and the frames are the ones `run` writes with every block pinned."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tiny_families_experts import build_tiny_wan22_a14b

from omni_console.console.cli import main
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.ram_plan import fixed_host_bytes, host_items
from omni_console.engine.planning.request_profile import RequestSize
from omni_console.engine.planning.tier_plan import smallest_peak
from omni_console.offload.policy import OffloadPolicy

REQUEST = ["--device", "cpu", "--steps", "4", "--height", "32", "--width", "32", "--frames", "5",
           "--max-sequence-length", "32", "--guidance", "3", "--seed", "3", "--json"]


@pytest.fixture(scope="module")
def wan22_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_wan22_a14b(tmp_path_factory.mktemp("models") / "wan22-a14b", seed=0)


def _run(model: Path, out: Path, capsys, *extra: str) -> tuple[dict, list[np.ndarray], str]:
    assert main(["run", "--model", str(model), *REQUEST, "--output", str(out), *extra]) == 0
    captured = capsys.readouterr()
    frames = [np.asarray(Image.open(out.parent / f"{out.stem}-{i:04d}.png")) for i in range(1, 6)]
    return json.loads(captured.out), frames, captured.err


@pytest.mark.slow
@pytest.mark.parametrize("resident", [0, 1], ids=["streamed", "one-resident"])
def test_a_budget_below_one_expert_reads_the_experts_from_disk_and_draws_the_same_frames(
        wan22_dir: Path, wan_loadable, tmp_path: Path, capsys, resident: int):
    plan = make_plan(discover_model(wan22_dir), OffloadPolicy(resident_layers=resident))
    per = plan.experts[0].count
    items, _ = host_items(plan)
    fixed = fixed_host_bytes(plan, size=RequestSize(height=32, width=32, frames=5), on_cpu=True)
    budget = smallest_peak(items, fixed) + max(i.nbytes for i in items)  # about one block pinned, not an expert
    flags = ["--resident-layers", str(resident)]
    pinned, expected, _ = _run(wan22_dir, tmp_path / "pinned" / "x.png", capsys, *flags)
    report, frames, err = _run(wan22_dir, tmp_path / "tiered" / "x.png", capsys, *flags, "--ram-budget", f"{budget}B")
    ram = report["ram_plan"]
    assert pinned["ram_plan"] is None and ram["host_peak_bytes"] <= budget
    tiers = ram["block_tiers"]
    assert len(tiers) == 2 * per  # HostTiers over Plan.blocks: transformer's blocks, then transformer_2's
    assert sum(t == "pinned" for t in tiers) < per and "disk" in tiers[per:]  # the second expert mostly on disk
    lines = {line.split(" ")[0]: line for line in ram["reasons"] if "expert) DiT blocks" in line}
    assert "from disk" in lines["transformer_2"] and "transformer" in lines
    assert all(np.array_equal(a, b) for a, b in zip(expected, frames, strict=True))
    assert "from disk" in err or "from the page cache" in err  # the staging log names the tier
