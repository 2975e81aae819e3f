"""`--stream-dtype` in `plan` (text and JSON) and in the console's forecast rows: the figures are at the
stored dtype, and the plan says that outputs change and by how much on the demo."""

from __future__ import annotations

import json
from pathlib import Path

from omni_console.console.cli import main
from omni_console.console.plan_context import LinkInfo
from omni_console.console.widgets.plan_forecast import forecast_rows
from omni_console.engine.loading.stream_dtype import DEMO_DIFFERENCE
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.plan import make_plan
from omni_console.offload.policy import build_policy


def _json(capsys, model: Path, *extra: str) -> dict:
    assert main(["plan", "--model", str(model), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_json_and_text_show_fp8_storage(demo_model_dir: Path, capsys):
    plain = _json(capsys, demo_model_dir)["forecast"]
    fp8 = _json(capsys, demo_model_dir, "--stream-dtype", "float8_e4m3fn")
    f = fp8["forecast"]
    assert plain["stream_dtype"] is None and f["stream_dtype"] == "float8_e4m3fn"
    assert fp8["policy"]["stream_dtype"] == "float8_e4m3fn"
    assert f["pinned_host_bytes"] < plain["pinned_host_bytes"]
    assert f["streamed_bytes_per_forward"] < 0.5 * plain["streamed_bytes_per_forward"]  # float32 demo
    assert f["upcast_scratch_bytes"] > 0 and "differ" in f["storage_note"]
    assert any("--stream-dtype" in gap for gap in fp8["vllm_omni"]["gaps"])
    assert main(["plan", "--model", str(demo_model_dir), "--stream-dtype", "float8_e4m3fn"]) == 0
    text = capsys.readouterr().out
    assert "DiT weights stored in" in text and f"mean |Δ| {DEMO_DIFFERENCE['float8_e4m3fn'][0]:.2f}" in text


def test_bad_storage_flags_exit_2(demo_model_dir: Path, capsys):
    assert main(["plan", "--model", str(demo_model_dir), "--fp8-modulation"]) == 2
    assert "needs fp8 storage" in capsys.readouterr().err
    assert main(["plan", "--model", str(demo_model_dir), "--stream-dtype", "int8"]) == 2


def test_console_rows_name_the_stored_dtype(demo_model_dir: Path):
    model = discover_model(demo_model_dir)
    link = LinkInfo(is_cuda=False)
    rows = forecast_rows(make_plan(model, build_policy({}, 0, stream_dtype="float8_e5m2")), link)
    stored = [r for r in rows if r[0] == "DiT weights stored in"]
    assert stored and stored[0][1] == "float8_e5m2" and "differ" in stored[0][2]
    assert not [r for r in forecast_rows(make_plan(model, build_policy({}, 0)), link) if "stored" in r[0]]


def test_stream_dtype_for_a_unet_pipeline_plans_fp8_units(tmp_path: Path, capsys):
    """A UNet's units are stored in fp8 too (diffusers' layerwise-casting rule): `plan` shows the smaller bytes."""
    from tiny_families_unet import build_tiny_sdxl

    sdxl = build_tiny_sdxl(tmp_path / "sdxl")
    plain = _json(capsys, sdxl)["forecast"]
    f = _json(capsys, sdxl, "--stream-dtype", "float8_e4m3fn")["forecast"]
    assert f["stream_dtype"] == "float8_e4m3fn" and "differ" in f["storage_note"]
    assert f["storage_note"].startswith("UNet weights stored in")
    assert main(["plan", "--model", str(sdxl), "--stream-dtype", "float8_e4m3fn"]) == 0
    assert "UNet weights stored in" in capsys.readouterr().out
    assert f["streamed_bytes_per_forward"] < 0.5 * plain["streamed_bytes_per_forward"]  # float32 fixture
    assert f["upcast_scratch_bytes"] > 0


def test_the_forecasts_skip_patterns_are_diffusers_own():
    """`plan` forecasts fp8 bytes without importing diffusers: its copy of the skip patterns must agree."""
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN

    from omni_console.engine.model_dir.fp8_names import SKIP_PATTERNS

    assert tuple(DEFAULT_SKIP_MODULES_PATTERN) == SKIP_PATTERNS
