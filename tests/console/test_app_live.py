"""Pilot tests of load → live → generate → unload on the demo model (CPU), failures, telemetry and quit."""

from __future__ import annotations

import re
import threading

import pytest
from app_helpers import finish, load, make_app, press_quit, screen_text, until
from textual.widgets import Input

from omni_console.console import app as app_module
from omni_console.console.screens import GenerateDialog, LiveScreen, PlanScreen
from omni_console.engine.engine import EngineState
from omni_console.engine.loading.loader import LoadCancelled
from omni_console.offload.events import StagingEvent, TelemetryEvent
from omni_console.offload.policy import build_policy
from omni_console.offload.streamer import LayerwiseStreamer
from omni_console.offload.telemetry import (
    HostMemory,
    NvmlMemory,
    TelemetrySnapshot,
    TorchMemory,
    TorchMemorySource,
)


def line_with(text: str, label: str) -> str:
    line = next((ln for ln in text.splitlines() if label in ln), None)
    assert line is not None, f"{label!r} not on screen:\n{text}"
    return line


@pytest.mark.slow
async def test_load_generate_unload_end_to_end_on_cpu(app, engine, tmp_path):
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        await select_vae_resident(pilot, app)
        await load(pilot, app)
        live = app.live_screen
        assert engine.state == EngineState.READY
        assert engine.plan.policy.dlo_offload_components == {"vae": False}
        loading_log = "\n".join(app.plan_screen.load_log.lines)  # the plan screen's log while loading
        assert "LOAD transformer" in loading_log and "COPY " in loading_log, loading_log
        assert "H2D" not in loading_log and "GB/s" not in loading_log, loading_log
        # residency: vae resident by policy, encoders on the host between stages, DiT blocks streamed
        rows = {r.name: r.state for r in live.residency.rows}
        assert rows["vae"] == "resident" and rows["text_encoder"] == "host"
        assert rows["transformer (non-block modules)"] == "resident"
        assert {rows[f"transformer.single_transformer_blocks.{i}"] for i in range(4)} <= {"host", "device"}
        assert any("vae: resident on cpu" in line for line in live.staging.lines)  # load events kept
        # loaded without live re-plan, the policy is read-only: no policy key works or is shown here
        assert "space" not in live.active_bindings
        footer = screen_text(app).splitlines()[-1]
        assert "layer" not in footer and "default" not in footer
        before = engine.plan.policy
        await pilot.press("plus", "d")
        assert engine.plan.policy == before
        assert "read-only while loaded" in screen_text(app)

        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, GenerateDialog))
        dialog = app.screen
        dialog.query_one("#steps", Input).value = "3"
        dialog.query_one("#prompt", Input).value = "a red cube"
        await pilot.press("enter")
        await finish(pilot, app.last_command["generate"], lambda: not app.generating)
        [output] = (tmp_path / "out").iterdir()
        assert re.fullmatch(r"\d{8}-\d{6}-request-1\.png", output.name)
        assert app.last_output == output.resolve()
        assert app.notices[-1] == (f"image saved: {output.resolve()}", "information")
        assert [s.step for s in live.steps.steps] == [1, 2, 3]
        bar = live.gen_progress
        assert (bar.progress, bar.total) == (3, 3)
        assert "request 1: 3 steps" in screen_text(app)
        assert "request 1 step 3/3" in screen_text(app)  # step timings summary
        # on a CPU a transfer is a host copy: no "H2D", no rate that would read as link bandwidth
        copies = [line for line in live.staging.lines if " COPY transformer" in line]
        assert copies and all("host copy (CPU: no device link)" in line for line in copies)
        assert not any("H2D" in line or "GB/s" in line for line in live.staging.lines)

        await pilot.press("u")
        await finish(pilot, app.last_command["unload"], lambda: isinstance(app.screen, PlanScreen))
        assert engine.state == EngineState.UNLOADED and engine.placement is None
        assert app.phase == "plan" and app.live_screen is None
        await pilot.press("d")  # editable again
        assert app.policy.dlo_offload_components == {"vae": False, "default": False}


async def select_vae_resident(pilot, app) -> None:
    await pilot.press(*["j"] * 6, "space")
    assert app.policy.dlo_offload_components == {"vae": False}


@pytest.mark.slow
async def test_generate_dialog_rejects_bad_input_and_escape_cancels(app):
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, GenerateDialog) and bool(app.screen.query("#size")))
        dialog = app.screen
        assert dialog.query_one("#size", Input).value == "64x64"  # the demo's working defaults
        assert dialog.query_one("#steps", Input).value == "2"
        dialog.query_one("#size", Input).value = "big"
        await pilot.press("enter")
        assert app.screen is dialog and "size must be WxH or N" in dialog.error
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, LiveScreen))
        assert "generate" not in app.last_command and not app.generating


@pytest.mark.slow
async def test_failing_load_shows_the_error_and_returns_to_the_plan_screen(app, engine, monkeypatch):
    def broken_attach(self):
        raise RuntimeError("slot allocation failed (injected)")

    monkeypatch.setattr(LayerwiseStreamer, "attach", broken_attach)
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.pause()
        await pilot.press("l")
        await finish(pilot, app.last_command["load"], lambda: app.phase == "plan")
        assert isinstance(app.screen, PlanScreen)
        assert engine.state == EngineState.FAILED and engine.placement is None and engine.pipe is None
        reason = "RuntimeError: slot allocation failed (injected)"
        assert app.notices[-1] == (f"load failed: {reason}", "error")
        assert f"load failed: {reason} — memory released" in screen_text(app)
        assert "ERROR load: " + reason in "\n".join(app.plan_screen.load_log.lines)
        await pilot.press("plus")  # the plan screen is usable again
        assert app.policy.resident_layers == 1
        monkeypatch.undo()
        await load(pilot, app)  # and a retry succeeds
        assert engine.state == EngineState.READY


@pytest.mark.slow
async def test_escape_cancels_a_load(app, engine, monkeypatch):
    entered = threading.Event()

    def slow_load(model, *, progress=None, cancel=None, **_options):
        entered.set()
        assert cancel is not None and cancel.wait(30)  # returns once the operator pressed esc
        raise LoadCancelled("load cancelled")

    monkeypatch.setattr("omni_console.engine.engine.start_loading", slow_load)
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.pause()
        await pilot.press("l")
        assert entered.wait(30)
        assert app.phase == "loading"
        assert app.plan_screen.active_bindings["escape"].enabled
        await pilot.press("space")  # toggles are disabled while loading
        assert app.policy.dlo_offload_components == {}
        await pilot.press("escape")
        await finish(pilot, app.last_command["load"], lambda: app.phase == "plan")
        assert engine.state == EngineState.FAILED and engine.failure == "load cancelled"
        assert app.notices[-1] == ("load cancelled; memory released", "warning")


@pytest.mark.slow
async def test_allocator_and_nvml_panels_show_the_injected_telemetry(app):
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        app.sampler.sample_now(publish=True)  # before load: kept and replayed into the panels
        app.drain_events()
        await load(pilot, app)
        app.sampler.sample_now(publish=True)
        app.drain_events()
        await pilot.pause()
        text = screen_text(app)
        for label, value in [
            ("torch allocated (live tensors)", "3.0 GB"),
            ("torch reserved (caching allocator)", "5.0 GB"),
            ("cached = reserved − allocated", "2.0 GB"),
            ("NVML used (all processes + context)", "12.3 GB"),
            ("NVML reserved (driver/firmware)", "560.0 MB"),
            ("free for us = NVML free + torch cached", "139.7 GB"),
            ("pinned bytes held (engine)", "3.6 MB"),
            ("RAM available", "30.0 GB"),
        ]:
            assert value in line_with(text, label), label
        assert list(app.live_screen.allocator.row("torch.allocated").history) == [3e9, 3e9]
        # a directly published sample with other numbers shows up after the next drain
        snap = TelemetrySnapshot(t=99.0, torch=TorchMemory(allocated=7 * 10**9, reserved=8 * 10**9, cached=10**9),
                                 nvml=NvmlMemory(unavailable="NVML init failed: NVML Shared Library Not Found"),
                                 host=HostMemory(rss=1))
        app.engine.bus.publish(TelemetryEvent(t=99.0, snapshot=snap))
        app.drain_events()
        await pilot.pause()
        text = screen_text(app)
        assert "7.0 GB" in line_with(text, "torch allocated (live tensors)")
        assert "unavailable: NVML init failed: NVML Shared Library Not Found" in text


@pytest.mark.slow
async def test_cpu_panels_say_unavailable_with_the_reason(engine, tmp_path):
    class NoNvml:
        def read(self):
            return NvmlMemory(unavailable="NVML init failed: NVML Shared Library Not Found")

    app = make_app(engine, tmp_path, sources=[TorchMemorySource("cpu"), NoNvml()])
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        app.sampler.sample_now(publish=True)
        app.drain_events()
        # the memory panels redraw on the drain ticks (staggered): wait for the sample to reach the screen
        await until(pilot, lambda: "unavailable: no CUDA device (device is cpu)" in screen_text(app))
        text = screen_text(app)
        assert "unavailable: no CUDA device (device is cpu)" in text
        assert "unavailable: NVML init failed: NVML Shared Library Not Found" in text
        assert "unavailable: no source configured" in text  # no host source injected
    app.shutdown()


@pytest.mark.slow
async def test_staging_log_pause_filter_and_dropped_events(app, engine):
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        live = app.live_screen
        await pilot.press("p")
        assert live.staging.paused and "staging events — paused" in screen_text(app)
        await pilot.press("p")
        assert not live.staging.paused and "staging events — live" in screen_text(app)
        await pilot.press("slash", "v", "a", "e")
        await pilot.pause()
        assert live.staging.filter_text == "vae"
        assert all("vae" in line for line in live.staging.visible_lines)
        await pilot.press("escape")  # closes the filter bar (and clears it)
        await pilot.pause()
        assert live.staging.filter_text == ""
        # a subscriber that falls behind drops the oldest events; the log title counts them
        app.sub.close()
        app.sub = engine.bus.subscribe(maxlen=2)
        for i in range(5):
            engine.bus.publish(StagingEvent(target=f"blk.{i}", direction="h2d", nbytes=1, seconds=0.1))
        app.drain_events()
        await pilot.pause()
        assert "3 dropped" in screen_text(app)


@pytest.mark.slow
async def test_quit_shuts_the_worker_down_and_releases_memory(app, engine):
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        await press_quit(pilot, app)
        assert app.return_value == 0
    assert app.shutdown(timeout=30)  # q exits at once; the process then waits for the release (app_main.run_app)
    assert engine.state == EngineState.UNLOADED and engine.placement is None
    assert app.worker._closed and not app.sampler.running
    with pytest.raises(RuntimeError, match="shut down"):
        app.worker.generate(None)


@pytest.mark.slow
async def test_live_screen_renders_at_small_and_large_sizes(app):
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        app.sampler.sample_now(publish=True)
        app.drain_events()
        for size in [(200, 60), (80, 24), (120, 40)]:
            await pilot.resize_terminal(*size)
            await pilot.pause()
            text = screen_text(app)
            assert len(text.splitlines()) == size[1] and len(text.splitlines()[0]) == size[0]
            assert "GPU memory" in text and "g generate" in text
            assert app.live_screen.has_class("-narrow") == (size[0] < 120)


def test_cli_invalid_policy_exits_2_with_one_line(capsys):
    from omni_console.console.cli import main

    assert main(["--mode", "resident", "--dlo-offload-components", '{"vae": false}']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["omni-console: error: dlo_offload_components requires distributed layerwise offload "
                   "(mode=dlo), got mode=resident"]


def test_cli_dit_in_policy_and_unknown_theme_exit_2(demo_model_dir, capsys):
    from omni_console.console.cli import main

    assert main(["--model", str(demo_model_dir), "--dlo-offload-components", '{"transformer": false}']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "DLO always owns DiT offload" in err[0]
    assert main(["--model", str(demo_model_dir), "--theme", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["omni-console: error: unknown theme 'nope'; valid themes: omni-dark, omni-high-contrast, "
                   "omni-light"]
    assert main(["--model", str(demo_model_dir), "--resident-layers", "7"]) == 2
    assert "between 0 and 6" in capsys.readouterr().err


def test_app_main_builds_a_configured_app(demo_model_dir, monkeypatch):
    from omni_console.console.app_main import build_app
    from omni_console.console.cli import build_parser

    args = build_parser().parse_args(["console", "--model", str(demo_model_dir), "--dlo-offload-components",
                                      '{"text_encoder": false}', "--resident-layers", "2", "--theme",
                                      "omni-light", "--telemetry-hz", "5"])
    app = build_app(args)
    try:
        assert app.policy == build_policy({"text_encoder": False}, 2)
        assert app.initial_theme == "omni-light" and app.sampler.hz == 5.0 and app.start_telemetry
    finally:
        app.shutdown()
    assert app_module.DEFAULT_OUT_DIR.name == "omni-console-out"
