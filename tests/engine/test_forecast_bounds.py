"""A forecast scaled from a small profile stays inside what that profile can say: a step time within
the bounds of fixed work vs FLOPs (2x of either end), else "unknown until measured"; never a million
seconds for a 3 MB model. `plan` and the console's engine path give one figure for one request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_console.console.cli import main
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.request_profile import RequestProfile, RequestSize, profile_dir, save_profile

SMALL = RequestSize(height=32, width=32)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("OMNI_CONSOLE_CACHE_DIR", str(root))
    return root


def _save_small_profile(model_dir: Path, block_s: float, device: str = "cpu") -> float:
    """A profile of the 32x32 request (its size as the engine keys it) with `block_s` per block; its step."""
    from omni_console.engine.planning.model_configs import fill_size

    model = discover_model(model_dir)
    blocks = sum(len(bl.block_bytes) for c in model.components for bl in c.block_lists)
    save_profile(RequestProfile(model=str(model_dir.resolve()), model_bytes=model.nbytes, device=device,
                                size=fill_size(model, SMALL), block_compute_s=[block_s] * blocks, other_s=0.0,
                                forwards_per_step=1, bandwidth_bytes_per_s=1e12, measured_at="2026-12-01T00:00:00"))
    return block_s * blocks


def _plan(capsys, model_dir: Path, *flags: str) -> dict:
    assert main(["plan", "--device", "cpu", "--model", str(model_dir), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)["request_forecast"]


def test_a_small_profile_gives_no_step_time_for_a_far_larger_request(demo_model_dir: Path, cache: Path, capsys):
    _save_small_profile(demo_model_dir, 0.05)
    forecast = _plan(capsys, demo_model_dir, "--height", "1024", "--width", "1024")
    assert forecast["step_seconds"] is None and forecast["step_source"] == "unknown"
    note = next(n for n in forecast["notes"] if "unknown until measured" in n)
    assert "scaled from 32x32" in note
    assert main(["plan", "--device", "cpu", "--model", str(demo_model_dir), "--height", "1024", "--width", "1024"]) == 0
    text = capsys.readouterr().out
    assert "step time" in text and "unknown until measured" in text


def test_a_small_growth_gives_a_figure_between_the_small_step_and_twice_it(demo_model_dir: Path, cache: Path, capsys):
    small = _save_small_profile(demo_model_dir, 0.05)
    forecast = _plan(capsys, demo_model_dir, "--height", "48", "--width", "48")
    assert forecast["step_basis"] == "scaled from 32x32"
    # all of the small step may be fixed work (then 48x48 takes as long) or all FLOPs (then it grows
    # with them): the figure is the middle, at most twice the small step when the FLOPs grow 4x or less
    assert small < forecast["step_seconds"] <= 2 * small * 1.0001


def test_a_gpu_profile_near_the_devices_peak_scales_by_its_flops(demo_model_dir: Path, cache: Path):
    """On a device the table names, a block cannot run faster than its FLOPs over the peak: a profile
    that is nearly all FLOPs scales with them, even over a range a CPU profile could not."""
    from omni_console.engine.planning.compute_estimate import forward_flops, peak_flops
    from omni_console.engine.planning.model_configs import fill_size
    from omni_console.engine.planning.plan import make_plan
    from omni_console.engine.planning.request_forecast import forecast_for
    from omni_console.offload.policy import build_policy

    device = "NVIDIA H100 80GB HBM3"
    plan = make_plan(discover_model(demo_model_dir), build_policy())
    model = plan.model
    small, large = fill_size(model, SMALL), fill_size(model, RequestSize(height=256, width=256))
    f_small, f_large = forward_flops(model, plan.forward[0], small), forward_flops(model, plan.forward[0], large)
    peak = peak_flops(device)
    assert f_small and f_large and peak
    save_profile(RequestProfile(model=str(demo_model_dir.resolve()), model_bytes=model.nbytes, device=device,
                                size=small, block_compute_s=[f * 1.05 / peak for f in f_small], other_s=0.0,
                                forwards_per_step=1, bandwidth_bytes_per_s=1e14, measured_at="2026-12-01"))
    forecast = forecast_for(plan, RequestSize(height=256, width=256), device)
    pure_flops = sum(f_large) / peak
    assert forecast.step_basis == "scaled from 32x32"
    assert forecast.step_s is not None and pure_flops <= forecast.step_s <= 1.1 * pure_flops
    cpu = forecast_for(plan, RequestSize(height=256, width=256), "cpu")  # the same times on a CPU: no peak known
    assert cpu.step_s is None


def _run_json(capsys, model_dir: Path, out: Path, size: list[str]) -> dict:
    assert main(["run", "--model", str(model_dir), "--device", "cpu", "--steps", "8", "--output", str(out),
                 "--overwrite", "--json", *size]) == 0
    return json.loads(capsys.readouterr().out)["forecast_check"]


@pytest.mark.slow
def test_after_a_small_run_plan_is_within_2x_of_the_next_run_or_says_unknown(ltx_model_dir: Path, cache: Path,
                                                                               capsys, tmp_path: Path):
    small = ["--frames", "9", "--height", "32", "--width", "32"]
    _run_json(capsys, ltx_model_dir, tmp_path / "small.mp4", small)
    assert any(profile_dir().glob("latest-*.json"))
    for size in (["--frames", "9", "--height", "64", "--width", "32"], ["--frames", "17", "--height", "64",
                                                                         "--width", "64"]):
        planned = _plan(capsys, ltx_model_dir, *size)
        check = _run_json(capsys, ltx_model_dir, tmp_path / "large.mp4", size)
        # what `plan` printed is what `run` forecast before its request: one forecast path
        assert check["predicted_step_s"] == planned["step_seconds"]
        if planned["step_seconds"] is None:
            assert any("unknown until measured" in n for n in planned["notes"]), planned["notes"]
            continue
        assert planned["step_basis"].startswith("scaled from")
        # the 2-core machine is shared: another process only ever makes a step slower, so a measurement
        # outside 2x is taken again (at most twice more) and the fastest counts; a forecast off by more than
        # 2x from an unloaded run still fails
        measured = check["measured_step_s"]
        for _ in range(2):
            if measured / 2 <= planned["step_seconds"] <= measured * 2:
                break
            measured = min(measured, _run_json(capsys, ltx_model_dir, tmp_path / "large.mp4", size)["measured_step_s"])
        assert measured / 2 <= planned["step_seconds"] <= measured * 2, (size, planned, check, measured)


@pytest.mark.slow
def test_plan_and_the_consoles_engine_forecast_give_one_figure(demo_model_dir: Path, cache: Path, capsys):
    """The console's plan screen and generate dialog ask `request_forecast_of` on the engine thread, with
    the streamer's observed link and the probe's: after a request they give `plan`'s figure."""
    from omni_console.console.plan_commands import request_forecast_of
    from omni_console.engine.api import GenerateRequest
    from omni_console.engine.engine import Engine
    from omni_console.offload.policy import build_policy

    engine = Engine(demo_model_dir, device="cpu")
    try:
        engine.load(build_policy())
        engine.generate(GenerateRequest(prompt="a fox", steps=3, height=32, width=32, seed=0))
        for h, w in ((32, 32), (48, 48), (1024, 1024)):
            planned = _plan(capsys, demo_model_dir, "--height", str(h), "--width", str(w))
            size = RequestSize(height=h, width=w)
            for plan in (None, engine.plan):  # the dialog (the loaded plan), the plan screen (the one shown)
                console = request_forecast_of(size, plan, 12345.0)(engine)
                assert console is not None and console.step_s == planned["step_seconds"], (h, w)
                assert console.step_source == planned["step_source"]
    finally:
        engine.close()


def test_the_budgets_reasons_give_no_step_time_where_the_forecast_cannot(demo_model_dir: Path, cache: Path, capsys):
    _save_small_profile(demo_model_dir, 0.05)
    model = discover_model(demo_model_dir)
    doc = _plan_doc(capsys, demo_model_dir, "--height", "1024", "--width", "1024", "--vram-budget",
                    f"{model.nbytes * 100}B")
    assert doc["request_forecast"]["step_seconds"] is None
    reasons = " ".join(doc["auto_plan"]["reasons"])
    assert "predicted step unknown" in reasons and "unknown until measured" in reasons
    assert "predicted step 0." not in reasons


def _plan_doc(capsys, model_dir: Path, *flags: str) -> dict:
    assert main(["plan", "--device", "cpu", "--model", str(model_dir), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)
