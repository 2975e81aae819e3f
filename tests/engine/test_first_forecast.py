"""A first request's forecast before any profile exists: what `plan` prints and what the estimates do
with the size (CPU; the demo and the tiny Wan). The calibration against GPU runs is in
test_estimate_calibration.py."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from omni_console.console.cli import main
from omni_console.console.plan_context import LinkInfo
from omni_console.console.request_defaults import forecast_line
from omni_console.console.widgets.plan_forecast import forecast_rows
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.activation_estimate import BASIS, estimate_phases
from omni_console.engine.planning.model_configs import call_defaults, default_size, fill_size
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.profile_basis import profile_for
from omni_console.engine.planning.request_forecast import forecast_for
from omni_console.engine.planning.request_profile import RequestSize, profile_dir, save_profile
from omni_console.offload.policy import build_policy

GPU = "NVIDIA H200"  # a device the throughput table names: its step time is estimated


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(tmp_path / "cache"))


def _plan(model_dir: Path):
    return make_plan(discover_model(model_dir), build_policy({}, 0, "dlo", "leading", 2))


def _finite_positive(*values: float | int | None) -> bool:
    return all(v is not None and math.isfinite(v) and v > 0 for v in values)


def test_plan_on_a_fresh_install_estimates_activations_and_says_which_size(demo_model_dir: Path, capsys) -> None:
    assert main(["plan", "--model", str(demo_model_dir), "--device", "cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    request = doc["request_forecast"]
    assert request["peak_source"] == "estimated" and request["peak_basis"] == "estimated from config"
    assert (request["size"]["height"], request["size"]["width"]) == (64, 64)  # the demo's own request
    assert {"height", "width"} <= set(request["size_assumed"])
    weights = doc["forecast"]["peak_device_weight_bytes"]
    assert request["peak_bytes"] > weights and all(v > 0 for v in request["phase_peaks"].values())
    assert request["step_seconds"] is None and request["step_source"] == "unknown"  # a CPU: no guessed number
    assert main(["plan", "--model", str(demo_model_dir), "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "estimated from config" in text and "size 64x64: height, width" in text
    assert "from the pipeline's defaults (no flag given)" in text and "0.000 s" not in text


def test_given_size_flags_are_not_called_assumed(demo_model_dir: Path, capsys) -> None:
    assert main(["plan", "--model", str(demo_model_dir), "--device", "cpu", "--json", "--height", "128",
                 "--width", "128"]) == 0
    request = json.loads(capsys.readouterr().out)["request_forecast"]
    assert (request["size"]["height"], request["size"]["width"]) == (128, 128)
    assert "height" not in request["size_assumed"] and "guidance" in request["size_assumed"]


def test_a_gpu_forecast_before_any_profile_is_finite_positive_and_grows_with_the_size(demo_model_dir: Path) -> None:
    plan = _plan(demo_model_dir)
    sides = (64, 128, 256)
    forecasts = [forecast_for(plan, RequestSize(height=s, width=s), GPU) for s in sides]
    for f in forecasts:
        assert f.step_basis == BASIS and f.peak_basis == BASIS and f.step_source == "estimated"
        assert _finite_positive(f.step_s, f.floor_s, f.bandwidth, f.peak_bytes)
        assert f.bandwidth_source == "estimated"
    steps = [f.step_s for f in forecasts]
    denoise = [f.phase_peaks["denoise"] for f in forecasts]
    decode = [f.phase_peaks["vae_decode"] for f in forecasts]
    assert steps == sorted(steps) and denoise == sorted(denoise) and decode == sorted(decode)
    assert decode[2] > decode[1] > decode[0] and denoise[2] > denoise[0]
    assert forecast_for(plan, RequestSize(height=64, width=64), "Some Future Accelerator").step_s is None


def test_the_console_panel_labels_an_estimate(demo_model_dir: Path) -> None:
    plan = _plan(demo_model_dir)
    request = forecast_for(plan, RequestSize(height=64, width=64), GPU)
    rows = {label: note for label, _, note in forecast_rows(plan, LinkInfo(is_cuda=True), request)}
    assert "estimated from config" in rows["device memory of the process"]  # the card's figure on a GPU
    assert rows["step time"].startswith("estimated from config: copy schedule replayed over estimated block times")
    assert forecast_line(request, 4).endswith("denoising (estimated from config)")  # the generate dialog's line


def test_another_sizes_profile_is_scaled_and_labelled(demo_model_dir: Path) -> None:
    plan = _plan(demo_model_dir)
    model = plan.model
    measured_size = fill_size(model, RequestSize(height=64, width=64))
    measured = profile_for(plan, measured_size, GPU).profile  # an estimate, saved as if a request measured it
    assert measured is not None
    save_profile(measured.model_copy(update=dict(block_compute_s=[c * 3 for c in measured.block_compute_s],
                                                 measured_at="2026-12-01T00:00:00")))
    assert any(profile_dir().glob("*.json"))
    known = profile_for(plan, RequestSize(height=128, width=128), GPU)
    assert known.peak_basis == known.step_basis == "scaled from 64x64" and known.source == "estimated"
    fresh = estimate_phases(model, known.size)
    # scaled by the estimate's growth: the measured figure x (estimate at 128 / estimate at 64)
    ratio = fresh.denoise_extra / estimate_phases(model, measured_size).denoise_extra
    assert known.profile.denoise_extra_bytes == pytest.approx(measured.denoise_extra_bytes * ratio, rel=1e-6)
    assert sum(known.profile.block_compute_s) > 3 * sum(measured.block_compute_s)
    exact = profile_for(plan, measured_size, GPU)
    assert exact.peak_basis == "cached" and exact.source == "cached"


def test_wan_plans_for_its_default_video_and_frames_raise_every_phase(wan_model_dir: Path) -> None:
    model = discover_model(wan_model_dir)
    assert default_size(model).frames == call_defaults("WanPipeline")["num_frames"] == 81
    size = default_size(model)
    assert (size.height, size.width, size.max_sequence_length) == (480, 832, 512) and size.guidance == 5.0
    short, long = (estimate_phases(model, size.model_copy(update=dict(frames=f))) for f in (9, 33))
    assert _finite_positive(short.text_extra, short.denoise_extra, short.decode_extra)
    assert long.denoise_extra > short.denoise_extra and long.decode_extra > short.decode_extra
    assert long.text_extra == short.text_extra  # the prompt does not grow with the video
    assert short.geometry.forwards_per_step == 2  # Wan runs guidance as two forwards
    assert estimate_phases(model, size.model_copy(update=dict(guidance=1.0))).geometry.forwards_per_step == 1


def test_call_defaults_come_from_the_installed_source() -> None:
    assert call_defaults("FluxPipeline")["default_sample_size"] == 128
    assert call_defaults("StableDiffusion3Pipeline")["default_sample_size"] == 128  # its fallback literal
    assert call_defaults("NoSuchPipeline") == {} and call_defaults("not an identifier") == {}


@pytest.mark.parametrize(("component", "edit"), [
    ("transformer", {"num_attention_heads": 2**39, "attention_head_dim": 2**39}),
    ("transformer", {"num_attention_heads": "many", "attention_head_dim": -3}),
    ("vae", {"block_out_channels": [2**39] * 16}),
    ("text_encoder_2", {"d_model": 2**39, "num_heads": True}),
])
def test_hostile_config_numbers_leave_a_finite_forecast(demo_model_dir: Path, tmp_path: Path, capsys,
                                                        component: str, edit: dict) -> None:
    root = tmp_path / "model"
    shutil.copytree(demo_model_dir, root)
    config = root / component / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | edit))
    code = main(["plan", "--model", str(root), "--device", "cpu", "--json"])
    out = capsys.readouterr().out
    if code == 2:  # discovery may refuse the config itself: one line, nothing estimated
        return
    assert code == 0
    request = json.loads(out, parse_constant=lambda c: pytest.fail(f"plan --json wrote {c}"))["request_forecast"]
    assert all(0 < v <= 1 << 62 for v in [request["peak_bytes"], *request["phase_peaks"].values()])
    gpu = forecast_for(_plan(root), RequestSize(height=64, width=64), GPU)  # the step is estimated there too
    assert gpu.step_s is None or (math.isfinite(gpu.step_s) and 0 < gpu.step_s <= 1e8)
    assert all(0 < v <= 1 << 62 for v in gpu.phase_peaks.values())
