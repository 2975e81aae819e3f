"""`omni-console plan`: what an operator reads, in text and JSON, for several policies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omni_console.console.cli import main
from omni_console.engine.model_dir.discovery import discover_model


def plan_json(capsys, model: Path, *extra: str) -> dict:
    assert main(["plan", "--model", str(model), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_plan_default_policy(demo_model_dir: Path, capsys):
    doc = plan_json(capsys, demo_model_dir)
    assert doc["schema"] == "omni-console.plan/1"
    comps = {c["name"]: c for c in doc["components"]}
    assert comps["transformer"]["residency"] == "streamed" and comps["transformer"]["why"] == "dlo"
    for name in ("text_encoder", "text_encoder_2", "vae"):
        assert (comps[name]["residency"], comps[name]["why"]) == ("staged", "implicit")
    assert comps["tokenizer"]["residency"] == "none"

    model = discover_model(demo_model_dir)
    dit = model.component("transformer")
    blocks = [b for bl in dit.block_lists for b in bl.block_bytes]
    staged = [model.component(n).nbytes for n in ("text_encoder", "text_encoder_2", "vae")]
    f = doc["forecast"]
    assert f["device_resident_bytes"] == dit.non_block_bytes
    assert f["streamed_bytes_per_forward"] == sum(blocks)
    assert f["pinned_host_bytes"] == sum(blocks) + sum(staged)
    assert f["peak_device_weight_bytes"] == dit.non_block_bytes + 2 * max(blocks) + max(staged)
    assert doc["vllm_omni"]["flags"] == "--dlo-offload-components '{}' --dlo-resident-layers 0"


def test_json_plan_explicit_default_and_resident_layers(demo_model_dir: Path, capsys):
    doc = plan_json(capsys, demo_model_dir, "--dlo-offload-components",
                    '{"vae": true, "default": false}', "--resident-layers", "2")
    comps = {c["name"]: c for c in doc["components"]}
    assert (comps["vae"]["residency"], comps["vae"]["why"]) == ("staged", "explicit")
    assert (comps["text_encoder"]["residency"], comps["text_encoder"]["why"]) == ("resident", "default")
    model = discover_model(demo_model_dir)
    dit = model.component("transformer")
    blocks = [b for bl in dit.block_lists for b in bl.block_bytes]
    encoders = model.component("text_encoder").nbytes + model.component("text_encoder_2").nbytes
    f = doc["forecast"]
    assert f["num_resident_blocks"] == 2 and f["num_streamed_blocks"] == len(blocks) - 2
    assert f["device_resident_bytes"] == encoders + dit.non_block_bytes + sum(blocks[:2])
    assert f["streamed_bytes_per_forward"] == sum(blocks[2:])
    assert f["peak_device_weight_bytes"] == (encoders + dit.non_block_bytes + sum(blocks[:2]) + 2 * max(blocks[2:])
                                             + model.component("vae").nbytes)
    assert doc["vllm_omni"]["serve"].endswith(
        "--dlo-offload-components '{\"vae\": true, \"default\": false}' --dlo-resident-layers 2")
    assert "dlo_offload_components={'vae': True, 'default': False}" in doc["vllm_omni"]["python"]


def test_resident_mode_is_the_no_offload_baseline(demo_model_dir: Path, capsys):
    doc = plan_json(capsys, demo_model_dir, "--mode", "resident")
    assert all(c["residency"] in ("resident", "none") for c in doc["components"])
    assert doc["forecast"]["pinned_host_bytes"] == 0
    assert doc["forecast"]["device_resident_bytes"] == discover_model(demo_model_dir).nbytes


def test_text_plan_shows_table_forecast_and_flags(demo_model_dir: Path):
    out = subprocess.run(
        [sys.executable, "-m", "omni_console.console.cli", "plan", "--model", str(demo_model_dir),
         "--dlo-offload-components", '{"text_encoder": false}'],
        capture_output=True, text=True, env={"COLUMNS": "160", "PATH": ""}, check=True).stdout
    pinned = "pinned host memory" if torch.cuda.is_available() else "host memory (not pinned: CPU)"
    for expected in ("FluxTransformer2DModel", "streamed by DLO", "offloaded (staged)", "resident",
                     "transformer_blocks", "single_transformer_blocks", pinned,
                     "device peak weights", "--dlo-offload-components '{\"text_encoder\": false}'",
                     "--enable-distributed-layerwise-offload"):
        assert expected in out, expected


@pytest.mark.parametrize("flags,expected", [
    (["--dlo-offload-components", "[1]"], "must be a mapping of component names to booleans, got list"),
    (["--dlo-offload-components", '{"vae": 0}'], "dlo_offload_components['vae'] must be a boolean, got int"),
    (["--dlo-offload-components", "{bad"], "not valid JSON"),
    (["--dlo-offload-components", '{"transformer": false}'], "DLO always owns DiT offload"),
    (["--resident-layers", "99"], "resident_layers must be between 0 and 6"),
    (["--mode", "resident", "--dlo-offload-components", '{"vae": false}'], "requires distributed layerwise"),
])
def test_invalid_policy_exit_2_one_line(demo_model_dir: Path, capsys, flags, expected):
    assert main(["plan", "--model", str(demo_model_dir), *flags]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1 and "Traceback" not in err


def test_plan_without_model_uses_cached_demo(capsys):
    doc = plan_json_no_model(capsys)
    assert doc["model"]["pipeline_class"] == "FluxPipeline"
    # second call reuses the cache (same path)
    assert plan_json_no_model(capsys)["model"]["path"] == doc["model"]["path"]


def plan_json_no_model(capsys) -> dict:
    assert main(["plan", "--json"]) == 0
    return json.loads(capsys.readouterr().out)
