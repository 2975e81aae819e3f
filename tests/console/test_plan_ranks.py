"""`plan --gpus N`: the per-rank section (text and JSON) and every refused rank flag, one line and exit 2."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import one_error_line
from rich.console import Console

from omni_console.console import run_flags
from omni_console.console.cli import main
from omni_console.console.plan_view import render_plan
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning import request_profile
from omni_console.engine.planning.documents import PlanDocument
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.request_profile import RequestProfile, RequestSize, save_profile
from omni_console.engine.ranks.rank_forecast import NVLINK_BYTES_PER_S, rank_forecast
from omni_console.engine.ranks.rank_layout import RankLayout
from omni_console.offload.policy import build_policy
from omni_console.offload.units import format_bytes

STAGED = ("text_encoder", "text_encoder_2", "vae")



@pytest.fixture(autouse=True)
def _cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--gpus 2 --device cpu` means two processes: accepted on a CI machine with fewer cores too."""
    monkeypatch.setattr(os, "cpu_count", lambda: 8)


def _plan_out(capsys, model: Path, *flags: str) -> str:
    assert main(["plan", "--model", str(model), *flags]) == 0
    return capsys.readouterr().out


def _plan_json(capsys, model: Path, *flags: str) -> dict:
    return json.loads(_plan_out(capsys, model, "--json", *flags))


def _demo_bytes(model_dir: Path) -> tuple[list[int], int]:
    """The demo DiT's block sizes (execution order) and its staged encoders' and VAE's bytes."""
    model = discover_model(model_dir)
    blocks = [b for bl in model.component("transformer").block_lists for b in bl.block_bytes]
    return blocks, sum(model.component(name).nbytes for name in STAGED)


def _ranks_rows(out: str) -> dict[str, list[str]]:
    """The piped ranks table: figure -> [value, source]."""
    for section in out.strip("\n").split("\n\n"):
        lines = section.split("\n")
        if lines[0].split("\t") == ["figure", "value", "source"] and any("all 2 ranks" in x for x in lines):
            return {row[0]: row[1:] for row in (line.split("\t") for line in lines[1:])}
    raise AssertionError(f"no ranks table in:\n{out}")


def test_two_gpus_text_shows_one_ranks_share(demo_model_dir, capsys):
    out = _plan_out(capsys, demo_model_dir, "--gpus", "2", "--device", "cpu")
    blocks, staged = _demo_bytes(demo_model_dir)
    rows = _ranks_rows(out)
    pinned = sum(-(-b // 2) for b in blocks) + staged
    assert rows["pinned host memory (1/2 of each streamed block + staged)"] == [format_bytes(pinned), "headers"]
    assert rows["pinned host memory, all 2 ranks"][0] == format_bytes(2 * pinned)
    assert rows["host→device per DiT forward (PCIe)"][0] == format_bytes(sum(-(-b // 2) for b in blocks))
    assert rows["gathered per DiT forward (gloo)"][0] == format_bytes(sum(-(-b // 2) for b in blocks))
    assert rows["requests at once"] == ["2", "dp"]
    assert rows["step floor: max(compute, copy + gather)"] == ["unknown", "unknown"]  # never a guessed figure
    lines = out.splitlines()
    assert any(line.startswith("2 GPUs · data-parallel") and "AllGather" in line for line in lines)
    assert "note: encoders and VAEs are staged rank-locally: every rank pins its own whole master" in lines


def test_resident_layers_with_allgather_get_their_note(demo_model_dir, capsys):
    out = _plan_out(capsys, demo_model_dir, "--gpus", "2", "--device", "cpu", "--resident-layers", "2")
    note = [line for line in out.splitlines() if line.startswith("note: resident layers with AllGather")]
    assert note == ["note: resident layers with AllGather: allowed here — resident blocks are whole on every rank; "
                    "vLLM-Omni rejects them because its resident blocks come from a TP-aware loader"]


def test_one_gpu_output_is_unchanged(demo_model_dir, capsys):
    plain = _plan_out(capsys, demo_model_dir)
    assert _plan_out(capsys, demo_model_dir, "--gpus", "1") == plain
    assert _plan_out(capsys, demo_model_dir, "--gpus", "1", "--dlo-no-use-allgather") == plain
    assert "ranks" not in plain.lower() and _plan_json(capsys, demo_model_dir, "--gpus", "1")["ranks"] is None


def test_ranks_section_fits_80_columns_on_a_terminal(demo_model_dir):
    plan = make_plan(discover_model(demo_model_dir), build_policy(None, 1, "dlo"))
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=True, color_system=None)
    render_plan(plan, console=console, ranks=rank_forecast(plan, RankLayout(2)))
    out = buffer.getvalue()
    assert "ranks (2 GPUs, per rank)" in out and "gathered per DiT forward (NVLink)" in out
    assert "note: resident layers with AllGather" in out
    ranks = out[out.index("ranks (2 GPUs, per rank)"):]  # other tables may cut free text with … (table_fit)
    assert "…" not in ranks and max(len(line) for line in out.splitlines()) <= 80


def test_json_has_the_ranks_object(demo_model_dir, capsys):
    doc = _plan_json(capsys, demo_model_dir, "--gpus", "2", "--device", "cpu")
    PlanDocument.model_validate(doc)
    blocks, staged = _demo_bytes(demo_model_dir)
    shards = [-(-b // 2) for b in blocks]
    r = doc["ranks"]
    assert (r["gpus"], r["allgather"], r["parallel"], r["requests_at_once"]) == (2, True, "dp", 2)
    assert r["streamed_pinned_bytes"] == sum(shards) and r["staged_pinned_bytes"] == staged
    assert r["pinned_host_bytes"] == sum(shards) + staged and r["pinned_host_bytes_all_ranks"] == 2 * r[
        "pinned_host_bytes"]
    assert r["padding_bytes"] == 2 * sum(shards) - sum(blocks)
    assert r["shard_buffer_bytes"] == 2 * max(shards)
    assert r["device_peak_bytes"] >= doc["request_forecast"]["peak_bytes"] + 2 * max(shards)
    assert r["pcie_bytes_per_forward"] == r["nvlink_bytes_per_forward"] == sum(shards)
    assert r["step_floor_seconds"] is None and r["step_floor_source"] == "unknown"


def test_rank_local_pins_the_whole_plan_on_every_rank(demo_model_dir, capsys):
    doc = _plan_json(capsys, demo_model_dir, "--gpus", "2", "--device", "cpu", "--dlo-no-use-allgather")
    r, f = doc["ranks"], doc["forecast"]
    assert r["allgather"] is False and r["pinned_host_bytes"] == f["pinned_host_bytes"]
    assert r["pcie_bytes_per_forward"] == f["streamed_bytes_per_forward"] and r["nvlink_bytes_per_forward"] == 0
    assert r["device_peak_bytes"] == doc["request_forecast"]["peak_bytes"] and r["shard_buffer_bytes"] == 0
    rows = _ranks_rows(_plan_out(capsys, demo_model_dir, "--gpus", "2", "--device", "cpu", "--dlo-no-use-allgather"))
    assert rows["pinned host memory (whole streamed blocks + staged)"][0] == format_bytes(f["pinned_host_bytes"])
    assert not any(k.startswith("gathered") for k in rows)


def test_a_cached_profile_gives_the_step_floor(demo_model_dir, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))  # only this test sees the profile
    blocks, _ = _demo_bytes(demo_model_dir)
    model = discover_model(demo_model_dir)
    save_profile(RequestProfile(model=str(demo_model_dir.resolve()), model_bytes=model.nbytes, device="cpu",
                                size=RequestSize(), block_compute_s=[0.01] * len(blocks), other_s=0.02,
                                forwards_per_step=2, bandwidth_bytes_per_s=1e9, measured_at="2026-01-01T00:00:00"))
    r = _plan_json(capsys, demo_model_dir, "--gpus", "2", "--device", "cpu", "--dlo-no-use-allgather")["ranks"]
    # on a CPU copies add to compute: (blocks' compute + other + streamed bytes / rate) per forward, 2 forwards
    assert r["step_floor_seconds"] == pytest.approx(2 * (0.01 * len(blocks) + 0.02 + sum(blocks) / 1e9))
    assert r["step_floor_source"] == "cached" and r["forwards_per_step"] == 2
    cfg = _plan_json(capsys, demo_model_dir, "--gpus", "2", "--device", "cpu", "--dlo-no-use-allgather",
                     "--parallel", "cfg")["ranks"]
    assert cfg["forwards_per_step"] == 1 and cfg["requests_at_once"] == 1  # one guidance branch per rank


def test_gpus_on_cuda_gather_over_nvlink(demo_model_dir, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(run_flags, "no_gpu_driver", lambda: False)  # a driver, as on a GPU machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(request_profile, "device_name_for_plan", lambda device: "NVIDIA H200")
    r = _plan_json(capsys, demo_model_dir, "--gpus", "2", "--device", "cuda")["ranks"]
    assert r["gather_link"] == "NVLink" and r["nvlink_bandwidth_bytes_per_s"] == NVLINK_BYTES_PER_S
    assert "gathered per DiT forward (NVLink)" in _ranks_rows(_plan_out(capsys, demo_model_dir, "--gpus", "2"))


@pytest.mark.parametrize(("flags", "words"), [
    (["--gpus", "0"], "--gpus must be between 1 and 64, got 0"),
    (["--gpus", "two"], "argument --gpus: 'two' is not a whole number"),
    (["--parallel", "cfg", "--gpus", "3"], "it needs --gpus 2, got 3"),
    (["--parallel", "tp", "--gpus", "2"], "argument --parallel: invalid choice"),
    (["--gpus", "2", "--dlo-use-allgather", "--dlo-no-use-allgather"], "not allowed with argument"),
])
def test_bad_rank_flags_are_one_line_before_the_model_is_read(tmp_path, capsys, flags, words):
    missing = tmp_path / "no-such-model"  # a flag checked after discovery would report this folder instead
    assert main(["plan", "--model", str(missing), *flags]) == 2
    line = one_error_line(capsys)
    assert words in line and "no-such-model" not in line


def test_more_gpus_than_cuda_devices(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(run_flags, "no_gpu_driver", lambda: False)  # a driver, as on a GPU machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert main(["plan", "--model", str(tmp_path / "missing"), "--gpus", "99", "--device", "cuda"]) == 2
    assert "--gpus must be between 1 and 64, got 99" in one_error_line(capsys)
    assert main(["plan", "--model", str(tmp_path / "missing"), "--gpus", "8", "--device", "cuda"]) == 2
    line = one_error_line(capsys)
    assert "--gpus 8" in line and "2 CUDA devices" in line
    assert main(["plan", "--model", str(tmp_path / "missing"), "--gpus", "3"]) == 2  # default device: cuda here
    assert "2 CUDA devices" in one_error_line(capsys)


def test_cpu_ranks_are_processes_up_to_the_core_count(demo_model_dir, capsys, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert _plan_json(capsys, demo_model_dir, "--gpus", "4", "--device", "cpu")["ranks"]["gpus"] == 4
    assert main(["plan", "--model", str(demo_model_dir), "--gpus", "5", "--device", "cpu"]) == 2
    line = one_error_line(capsys)
    assert "--gpus 5" in line and "4 cores" in line


def test_cfg_parallel_needs_an_unconditional_branch(demo_model_dir, tmp_path, capsys):
    # FluxPipeline takes a negative prompt (true CFG): its two branches can go to two ranks
    assert _plan_json(capsys, demo_model_dir, "--gpus", "2", "--device", "cpu", "--parallel", "cfg")["ranks"][
        "requests_at_once"] == 1
    # FluxControlPipeline has the same components but only embedded guidance: no second branch
    control = tmp_path / "flux-control"
    shutil.copytree(demo_model_dir, control)
    index = control / "model_index.json"
    index.write_text(index.read_text().replace('"FluxPipeline"', '"FluxControlPipeline"'))
    assert main(["plan", "--model", str(control), "--gpus", "2", "--device", "cpu", "--parallel", "cfg"]) == 2
    line = one_error_line(capsys)
    assert "--parallel cfg: FluxControlPipeline has no unconditional branch" in line and "--parallel dp" in line
    assert main(["plan", "--model", str(control), "--gpus", "2", "--device", "cpu"]) == 0  # dp is fine


def test_vllm_omni_line_follows_the_rank_layout(demo_model_dir, capsys) -> None:
    import json as _json

    from omni_console.console.cli import main as _main

    assert _main(["plan", "--model", str(demo_model_dir), "--gpus", "2", "--device", "cpu", "--json"]) == 0
    vllm = _json.loads(capsys.readouterr().out)["vllm_omni"]
    assert "--data-parallel-size 2" in vllm["serve"] and "--dlo-use-allgather" in vllm["serve"]
    assert "dlo_use_allgather=True" in vllm["python"] and vllm["exact"]
    assert _main(["plan", "--model", str(demo_model_dir), "--gpus", "2", "--device", "cpu", "--json",
                  "--resident-layers", "1"]) == 0
    vllm = _json.loads(capsys.readouterr().out)["vllm_omni"]
    assert not vllm["exact"] and any("rejects resident layers with AllGather" in gap for gap in vllm["gaps"])
    assert _main(["plan", "--model", str(demo_model_dir), "--json"]) == 0
    assert "--dlo-no-use-allgather" in _json.loads(capsys.readouterr().out)["vllm_omni"]["serve"]
