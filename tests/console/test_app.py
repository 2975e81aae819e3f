"""Pilot tests of the console app's plan screen: policy toggles, JSON preview, forecast, themes, help.

The engine is the real one on the tiny demo Flux model (CPU); telemetry comes from fixed sources.
"""

from __future__ import annotations

import json
import threading

import pytest
from app_helpers import forecast_shown, make_app, screen_text, until
from textual.binding import Binding

from omni_console.console.app import OmniConsoleApp
from omni_console.console.policy_edits import toggle_component
from omni_console.console.screens import HelpScreen, LiveScreen, PlanScreen
from omni_console.engine.engine import Engine
from omni_console.engine.errors import ConfigError
from omni_console.engine.planning.export import vllm_serve_command
from omni_console.engine.planning.request_profile import RequestSize
from omni_console.offload.policy import build_policy
from omni_console.offload.units import format_bytes, format_seconds
from omni_console.themes import THEMES

ROWS = ["scheduler", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "transformer", "vae"]
AUX = ["text_encoder", "text_encoder_2", "vae"]


async def select(pilot, app: OmniConsoleApp, name: str) -> None:
    """Move the cursor to `name` with j / k presses, as an operator would."""
    delta = ROWS.index(name) - app.plan_screen.table.cursor_row
    await pilot.press(*(["j"] * delta if delta > 0 else ["k"] * -delta))
    assert app.plan_screen.table.selected_name == name


def residency_cell(app: OmniConsoleApp, name: str) -> tuple[str, str]:
    table = app.plan_screen.table
    return str(table.get_cell(name, "residency")), str(table.get_cell(name, "source"))


def forecast_expected(engine: Engine, policy) -> dict[str, str]:
    plan = engine.make_plan(policy)
    f = plan.forecast
    return {
        "device resident weights": format_bytes(f.device_resident_bytes),
        # with the activations estimated from the configs at the pipeline's default size (no profile yet)
        "device peak": format_bytes(engine.forecast(RequestSize(), plan=plan).peak_bytes),
        "pinned host memory": format_bytes(f.pinned_host_bytes),
        "streamed per DiT forward": format_bytes(f.streamed_bytes_per_forward),
    }


async def assert_forecast_matches(pilot, app: OmniConsoleApp, engine: Engine) -> None:
    await forecast_shown(pilot, app)  # the request forecast comes from the engine thread
    rows = app.plan_screen.forecast.rows
    for label, value in forecast_expected(engine, app.policy).items():
        assert rows[label] == value, (label, rows[label], value)


@pytest.mark.slow
async def test_plan_screen_shows_model_components_policy_and_forecast(app, engine):
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, PlanScreen)
        text = screen_text(app)
        assert str(engine.model.path) in text
        assert "device CPU" in text and "host RAM" in text
        for name in ROWS:
            assert name in text
        assert residency_cell(app, "transformer") == ("streamed by DLO", "DLO")
        assert residency_cell(app, "vae") == ("offloaded (staged)", "implicit")
        assert "--dlo-offload-components {}" in " ".join(text.split())
        assert app.plan_screen.policy_panel.command == vllm_serve_command(engine.make_plan(build_policy()))
        await assert_forecast_matches(pilot, app, engine)
        assert app.plan_screen.forecast.rows["transfer time per step"] == "no device link (CPU)"
        assert "no device link (CPU)" in text


@pytest.mark.slow
@pytest.mark.parametrize("name", AUX)
async def test_toggling_each_auxiliary_component_by_key(app, engine, name):
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.pause()
        await select(pilot, app, name)
        await pilot.press("space")
        assert app.policy.dlo_offload_components == {name: False}
        assert app.plan_screen.policy_panel.components_json == json.dumps({name: False}, separators=(", ", ": "))
        assert residency_cell(app, name) == ("resident", "explicit")
        assert f'{{"{name}": false}}' in screen_text(app)
        await assert_forecast_matches(pilot, app, engine)
        await pilot.press("enter")  # enter toggles too: back to offloaded, still explicit
        assert app.policy.dlo_offload_components == {name: True}
        assert residency_cell(app, name) == ("offloaded (staged)", "explicit")
        await pilot.press("x")  # clear the explicit entry
        assert app.policy.dlo_offload_components == {}
        assert residency_cell(app, name) == ("offloaded (staged)", "implicit")
        assert app.plan_screen.table.selected_name == name  # the cursor stayed on the row


@pytest.mark.slow
async def test_default_toggle_flips_components_without_their_own_entry(app, engine):
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.pause()
        await select(pilot, app, "vae")
        await pilot.press("space")  # vae: explicit False (resident)
        await pilot.press("d")  # absent default means True, so d sets it False
        assert app.policy.dlo_offload_components == {"vae": False, "default": False}
        assert residency_cell(app, "text_encoder") == ("resident", "default")
        assert residency_cell(app, "vae") == ("resident", "explicit")
        await pilot.press("d")
        assert app.policy.dlo_offload_components == {"vae": False, "default": True}
        assert residency_cell(app, "text_encoder_2") == ("offloaded (staged)", "default")
        assert app.plan_screen.policy_panel.components_json == '{"vae": false, "default": true}'
        await assert_forecast_matches(pilot, app, engine)


async def test_dit_toggle_is_refused_with_a_notification(app):
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.pause()
        await select(pilot, app, "transformer")
        await pilot.press("space")
        assert app.policy.dlo_offload_components == {}
        message, severity = app.notices[-1]
        assert message == "transformer is a DiT: DLO always owns DiT offload (use +/- for resident layers)"
        assert severity == "warning"
        await select(pilot, app, "tokenizer")
        await pilot.press("space")
        assert app.notices[-1][0] == "tokenizer has no weights: not part of the offload policy"
        assert "transformer" not in app.policy.dlo_offload_components


@pytest.mark.slow
async def test_resident_layers_stay_within_bounds_and_move_the_forecast(app, engine):
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.pause()
        await pilot.press("minus")
        assert app.policy.resident_layers == 0
        assert app.notices[-1][0] == "resident layers already at 0"
        for n in range(1, 7):
            await pilot.press("plus")
            assert app.policy.resident_layers == n
            await assert_forecast_matches(pilot, app, engine)
        await pilot.press("plus")
        assert app.policy.resident_layers == 6  # the demo has 6 DiT blocks
        assert app.notices[-1][0] == "resident layers already at 6 (every DiT block)"
        assert app.plan_screen.forecast.rows["streamed per DiT forward"] == format_bytes(0)
        assert residency_cell(app, "transformer")[0] == "streamed by DLO (6 resident)"
        assert "--dlo-resident-layers 6" in app.plan_screen.policy_panel.flags
        await pilot.press("minus")
        assert app.policy.resident_layers == 5


async def test_forecast_changes_as_predicted_by_the_plan(app, engine):
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.pause()
        before = engine.make_plan(app.policy).forecast
        await select(pilot, app, "vae")
        await pilot.press("space")
        after = engine.make_plan(app.policy).forecast
        vae = engine.model.component("vae").nbytes
        await forecast_shown(pilot, app)
        assert after.device_resident_bytes == before.device_resident_bytes + vae
        assert after.pinned_host_bytes == before.pinned_host_bytes - vae
        rows = app.plan_screen.forecast.rows
        assert rows["device resident weights"] == format_bytes(after.device_resident_bytes)
        assert rows["pinned host memory"] == format_bytes(after.pinned_host_bytes)
        assert rows["device peak"] == format_bytes(engine.forecast(RequestSize(), plan=engine.make_plan(app.policy))
                                                   .peak_bytes)


async def test_the_request_forecast_comes_from_the_engine_thread_and_says_so_until_it_does(app, engine):
    """The UI thread never computes it (it reads the streamer and the profile cache): while the engine thread
    is busy the peak says "forecasting…", keys still act at once, and the answer shows the same figures."""
    from omni_console.console.widgets.plan_forecast import FORECASTING

    gate = threading.Event()
    async with app.run_test(size=(140, 50)) as pilot:
        await forecast_shown(pilot, app)
        busy = app.worker.call(lambda _engine: gate.wait(30))  # the engine thread, busy for now
        try:
            await pilot.press("plus")
            assert app.policy.resident_layers == 1  # the edit itself is planned at once, on the UI thread
            assert app.plan_screen.forecast.rows["device resident weights"] == format_bytes(
                engine.make_plan(app.policy).forecast.device_resident_bytes)
            assert app.plan_screen.forecast.rows["device peak"] == FORECASTING and app.forecast_pending
        finally:
            gate.set()
        assert busy.result(timeout=30)
        await assert_forecast_matches(pilot, app, engine)


def test_forecast_rows_on_a_gpu_link_say_transfer_time_and_fit(engine):
    from omni_console.console.widgets.plan_forecast import LinkInfo, forecast_rows

    plan = engine.make_plan(build_policy())
    f = plan.forecast
    rows = {label: value for label, value, _ in forecast_rows(plan, LinkInfo(True, 55.4e9, "measured", 10**9, "x"))}
    assert rows["transfer time per step"] == format_seconds(f.streamed_bytes_per_forward / 55.4e9)
    assert rows["fits in device free memory"].startswith("yes")
    tight = LinkInfo(True, 55.4e9, "measured", f.peak_device_weight_bytes - 1000, "x")
    rows = {label: value for label, value, _ in forecast_rows(plan, tight)}
    assert rows["fits in device free memory"] == f"NO (short by {format_bytes(1000)})"
    rows = {label: value for label, value, _ in forecast_rows(plan, LinkInfo(True))}
    assert rows["transfer time per step"] == "measuring…"


async def test_resident_mode_refuses_toggles_and_m_switches_modes(engine, tmp_path):
    app = make_app(engine, tmp_path, build_policy({"vae": False}, 2))
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.pause()
        await pilot.press("m")
        assert app.policy.mode == "resident" and app.policy.dlo_offload_components == {}
        assert residency_cell(app, "transformer") == ("resident", "mode=resident")
        await select(pilot, app, "text_encoder")
        await pilot.press("space")
        assert app.policy.mode == "resident" and app.policy.dlo_offload_components == {}
        assert "press m to switch to dlo mode" in app.notices[-1][0]
        await pilot.press("m")  # back to dlo: the previous map and layers return
        assert app.policy == build_policy({"vae": False}, 2)
    app.shutdown()


@pytest.mark.slow
async def test_copy_command_puts_the_serve_line_on_the_clipboard(app, engine):
    async with app.run_test(size=(140, 50)) as pilot:
        await pilot.pause()
        await select(pilot, app, "text_encoder")
        await pilot.press("space", "c")
        expected = vllm_serve_command(engine.make_plan(build_policy({"text_encoder": False})))
        assert app.clipboard == expected
        assert """--dlo-offload-components '{"text_encoder": false}'""" in expected
        notice = app.notices[-1][0]
        assert "OSC 52" in notice and "may or may not accept it" in notice and "copied" not in notice
        assert notice.endswith(f"select by hand:\n{expected}")  # history; the screen shows it (test_copy_command)


async def test_theme_cycles_with_t_and_can_be_chosen(engine, tmp_path):
    app = make_app(engine, tmp_path, theme="omni-light")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert app.theme == "omni-light"
        seen = []
        for _ in THEMES:
            await pilot.press("t")
            seen.append(app.theme)
        assert sorted(seen) == sorted(THEMES) and seen[-1] == "omni-light"
    app.shutdown()
    with pytest.raises(ConfigError, match="unknown theme 'nope'; valid themes: omni-dark, omni-high-contrast"):
        OmniConsoleApp(engine, build_policy(), theme="nope", sources=[])


async def test_help_lists_every_binding(app):
    async with app.run_test(size=(120, 60)) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        help_text = app.screen.text
        for cls in (OmniConsoleApp, PlanScreen, LiveScreen):
            for binding in Binding.make_bindings(cls.BINDINGS):
                assert (binding.tooltip or binding.description) in help_text, binding
        assert "ctrl+p command palette" in help_text
        for words in ("↑ / ↓", "tab / shift+tab", "pgup / pgdn", "x remove the selected", "m switch mode"):
            assert words in help_text, words
        shown = screen_text(app)
        assert "toggle the selected encoder/VAE" in shown and "live screen (after load)" in shown
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, PlanScreen))


async def test_command_palette_offers_the_main_actions(app):
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        titles = {c.title: c for c in app.get_system_commands(app.screen)}
        for title in ("Load model", "Unload model", "Generate", "Cancel", "Copy vLLM-Omni command", "Next theme",
                      "Help", "Quit"):
            assert title in titles
        assert "Keys" not in titles  # one help entry in the palette, not two
        titles["Next theme"].callback()
        assert app.theme == "omni-light"
        titles["Generate"].callback()  # refused before load, with the reason
        assert app.notices[-1] == ("load the model first (l)", "warning")


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
async def test_plan_screen_renders_at_small_and_large_sizes(app, size):
    async with app.run_test(size=size) as pilot:
        # a loaded machine may need a few refreshes before the table and footer are composed
        await until(pilot, lambda: "text_encoder" in screen_text(app) and "l load" in screen_text(app))
        text = screen_text(app)
        assert len(text.splitlines()) == size[1]
        assert "text_encoder" in text and "l load" in text


def test_policy_edits_never_put_a_dit_in_the_policy(engine):
    policy = build_policy()
    for name in ROWS:
        edit = toggle_component(engine.model, policy, name)
        if edit.policy is not None:
            policy = edit.policy
    assert set(policy.dlo_offload_components) == set(AUX)


def test_bandwidth_sources_for_the_forecast():
    import torch

    from omni_console.console.bandwidth import ObservedBandwidth
    from omni_console.engine.device_probes import measure_h2d_bandwidth
    from omni_console.offload.events import StagingEvent

    assert measure_h2d_bandwidth(torch.device("cpu")) is None  # CPU: no device link
    observed = ObservedBandwidth()
    observed.observe(StagingEvent(target="b.0", direction="h2d", nbytes=2 << 20, seconds=0.001, sync=True))
    observed.observe(StagingEvent(target="b.1", direction="d2h", nbytes=2 << 20, seconds=0.001))
    assert observed.rate is None  # synchronous and device→host copies say nothing about the link
    observed.observe(StagingEvent(target="b.2", direction="h2d", nbytes=4 << 20, seconds=0.002))
    observed.observe(StagingEvent(target="b.3", direction="h2d", nbytes=2 << 20, seconds=0.002))
    assert observed.rate == pytest.approx((6 << 20) / 0.004)
