"""One figure, one name: a step's time is shown as the last step, the median step or the forecast, each
labelled as what it is and in one unit format; the streamed bytes carry one description in both
published documents."""

from __future__ import annotations

import json
from pathlib import Path

from omni_console.console.event_text import forecast_check_text
from omni_console.console.request_outcome import finished
from omni_console.console.widgets.key_numbers import KeyNumbers
from omni_console.console.widgets.step_timings import summarize
from omni_console.engine.events import ForecastCheck, StepTiming
from omni_console.offload.units import copied_text

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def _steps(*walls: float) -> list[StepTiming]:
    return [StepTiming(request_id=1, step=i + 1, total_steps=len(walls), wall_s=w, stall_s=w / 10, h2d_bytes=1000)
            for i, w in enumerate(walls)]


def test_step_panel_says_median_and_gives_the_median():
    text = summarize(_steps(0.1, 0.1, 1.0))  # mean 400.0 ms, median 100.0 ms, last 1.00 s
    assert "median step (last 3) 100.0 ms" in text, text
    assert "400.0 ms" not in text and "1.00 s" not in text


def test_header_says_last_step():
    numbers = KeyNumbers()
    numbers.show_step(_steps(0.1, 0.25)[-1])
    assert "last step 250.0 ms (stall 25.0 ms)" in numbers.text


def test_forecast_line_names_forecast_and_measured_in_one_format():
    check = ForecastCheck(request_id=1, predicted_peak=None, measured_peak=None, peak_source="unknown",
                          predicted_step_s=0.176, measured_step_s=0.16, step_source="cached")
    assert "step: forecast 176.0 ms vs measured 160.0 ms (+10.0%, cached)" in forecast_check_text(check)


def test_request_outcome_gives_the_median_step():
    from omni_console.engine.results import GenerateResult

    result = GenerateResult(request_id=3, image=None, seconds=1.5, steps=_steps(0.1, 0.1, 1.0))
    outcome = finished(result, output=None, save_error=None)
    assert "(median step 100.0 ms)" in outcome.status, outcome


def test_copied_bytes_are_labelled_against_the_weights():
    assert copied_text(2_504_960, 2_190_336) == "2.5 MB (2.2 MB of weights + 314.6 kB padding)"
    assert copied_text(1000, 1000) == "1.0 kB"


def test_streamed_bytes_have_one_description_in_plan_and_run_documents():
    plan = json.loads((SCHEMAS / "plan.schema.json").read_text())
    run = json.loads((SCHEMAS / "run-report.schema.json").read_text())
    described = [d["properties"]["streamed_bytes_per_forward"]["description"]
                 for doc in (plan, run) for d in doc["$defs"].values()
                 if "streamed_bytes_per_forward" in d.get("properties", {})]
    assert len(described) == 2 and described[0] == described[1] and "per DiT/UNet forward" in described[0]
    assert "copied_bytes_per_forward" in run["properties"]
