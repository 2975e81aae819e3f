"""On two GPUs (NCCL, AllGather): `run --gpus 2` through the console's `GroupEngine` writes, for each
rank's seed, the image a one-GPU run writes for that seed (bit-identical: the same bytes are gathered
back on the same kind of GPU), and reports each rank's own pinned shard."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from omni_console.console.cli import main

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs two NVIDIA GPUs")]


def test_two_gpus_write_the_one_gpu_images_and_report_each_rank(demo_model_dir: Path, tmp_path: Path,
                                                                capsys) -> None:
    model = ["--model", str(demo_model_dir), "--device", "cuda"]
    for seed in (5, 6):
        assert main(["run", *model, "--seed", str(seed), "--output", str(tmp_path / f"one-{seed}.png")]) == 0
    capsys.readouterr()
    assert main(["run", *model, "--gpus", "2", "--seed", "5", "--output", str(tmp_path / "two.png"), "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["device"] == "cuda" and report["allgather"] and [r["seed"] for r in report["ranks"]] == [5, 6]
    for r in report["ranks"]:  # each rank pins its shard of the streamed blocks, not all of them
        assert 0 < r["block_host_bytes"] < report["streamed_bytes"] and r["pinned_bytes"] >= r["block_host_bytes"]
    assert "[rank 0] step" in err and "[rank 1] step" in err
    for seed in (5, 6):
        ours = np.asarray(Image.open(tmp_path / f"two-seed{seed}.png"))
        assert np.array_equal(ours, np.asarray(Image.open(tmp_path / f"one-{seed}.png"))), seed
