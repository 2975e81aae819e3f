"""On a CPU every report uses CPU words: no pinned memory, no host→device link or rate, and the live
residency panel does not call host RAM "the device"."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
import torch
from app_helpers import load, screen_text
from rich.console import Console

from omni_console.console.plan_view import PINNED_ON_CPU, render_plan
from omni_console.console.screens.live import RESIDENCY_TITLE_CPU
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.planning.plan import make_plan
from omni_console.engine.planning.request_forecast import forecast_for
from omni_console.engine.planning.request_profile import RequestSize
from omni_console.offload.policy import build_policy


@pytest.fixture(scope="module")
def plan(demo_model_dir):
    return make_plan(discover_model(demo_model_dir), build_policy({}, 0))


@pytest.mark.parametrize("terminal", [False, True])
def test_plan_on_a_cpu_says_not_pinned_and_shows_no_link(plan, terminal):
    forecast = replace(forecast_for(plan, RequestSize(), "cpu"), bandwidth=23.1e6, bandwidth_source="cached")
    buf = io.StringIO()
    render_plan(plan, Console(file=buf, width=160, force_terminal=terminal, color_system=None),
                forecast=forecast, on_cpu=True)
    text = buf.getvalue()
    assert PINNED_ON_CPU in text and "pinned host memory" not in text
    assert "host→device link" not in text and "MB/s" not in text and "GB/s" not in text


def test_plan_on_a_gpu_keeps_pinned_and_the_link_in_its_unit(plan):
    forecast = replace(forecast_for(plan, RequestSize(), "cpu"), bandwidth=23.1e6, bandwidth_source="cached")
    buf = io.StringIO()
    render_plan(plan, Console(file=buf, width=160, force_terminal=False), forecast=forecast, on_cpu=False)
    text = buf.getvalue()
    assert "pinned host memory\t" in text
    assert "host→device link\t23.1 MB/s\tcached" in text  # not `0.0 GB/s`


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's words")
async def test_live_residency_panel_on_a_cpu_does_not_say_on_the_device(app):
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await load(pilot, app)
        await pilot.pause()
        text = screen_text(app)
        assert RESIDENCY_TITLE_CPU in text and "what is on the device" not in text
