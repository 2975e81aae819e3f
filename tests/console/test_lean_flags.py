"""The lean-phase flags as an operator uses them: parsed with clear errors, shown by `plan` (text and
JSON), in the console's forecast and policy panels, and chosen by `--vram-budget` only when needed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from test_lean_phases import _wan_with_deep_encoder  # noqa: E402

from omni_console.console.cli import main  # noqa: E402
from omni_console.console.plan_context import LinkInfo  # noqa: E402
from omni_console.console.widgets.plan_forecast import forecast_rows  # noqa: E402
from omni_console.engine.model_dir.discovery import discover_model  # noqa: E402
from omni_console.engine.planning.plan import make_plan  # noqa: E402
from omni_console.engine.planning.request_forecast import forecast_request  # noqa: E402
from omni_console.engine.planning.request_profile import RequestSize  # noqa: E402
from omni_console.offload.policy import build_policy  # noqa: E402

SIZE_FLAGS = ["--device", "cpu", "--height", "480", "--width", "832", "--frames", "9"]


@pytest.fixture(scope="module")
def wan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _wan_with_deep_encoder(tmp_path_factory.mktemp("lean-cli") / "wan")


def test_a_bad_mode_is_one_line_and_exit_2(capsys):
    assert main(["plan", "--vae-tiling", "maybe"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--vae-tiling" in err and "'auto', 'on', 'off'" in err


def test_plan_shows_each_lean_phase_with_its_cost(wan: Path, capsys):
    assert main(["plan", "--model", str(wan), *SIZE_FLAGS, "--vae-tiling", "on", "--stream-encoders", "on"]) == 0
    out = capsys.readouterr().out
    assert "text encoders streamed layer by layer\tpeak " in out and "exact (bit-identical)\tlean phase" in out
    assert "VAE decode tiled\tpeak " in out and "(15 overlapping tiles), pixels differ" in out
    assert "no vLLM-Omni spelling" in out
    assert main(["plan", "--model", str(wan), *SIZE_FLAGS, "--vae-tiling", "on", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["policy"]["vae_tiling"] == "on" and doc["policy"]["stream_encoders"] == "auto"
    (tiled,) = doc["request_forecast"]["lean_phases"]
    assert tiled["name"] == "vae_tiling" and tiled["exact"] is False and tiled["line"].startswith("VAE decode tiled")


def test_the_budget_streams_the_encoder_only_when_it_must(wan: Path, capsys):
    # a small frame, so the deep encoder's text phase (not the decode) is what a tight budget must fit: its
    # float32 activations at 512 tokens (about 20 MB) and its layers (streaming them saves about 0.9 MB)
    small = ["--device", "cpu", "--height", "32", "--width", "32", "--frames", "1"]
    assert main(["plan", "--model", str(wan), *small, "--vram-budget", "100MB", "--json"]) == 0
    roomy = json.loads(capsys.readouterr().out)
    assert roomy["request_forecast"]["lean_phases"] == [] and roomy["policy"]["stream_encoders"] == "auto"
    assert main(["plan", "--model", str(wan), *small, "--vram-budget", "21.8MB", "--json"]) == 0
    tight = json.loads(capsys.readouterr().out)
    assert tight["policy"]["stream_encoders"] == "on"
    assert any(r.startswith("text encoders streamed layer by layer: peak") for r in tight["auto_plan"]["reasons"])
    assert main(["plan", "--model", str(wan), *small, "--vram-budget", "21.8MB", "--stream-encoders", "off"]) == 2
    err = capsys.readouterr().err
    assert "nothing fits in 21.8 MB" in err and "by phase: text encoding" in err and err.count("\n") == 1


def test_the_forecast_and_policy_panels_show_the_lean_phases(wan: Path):
    from omni_console.console.widgets.plan_policy import PolicyPanel

    plan = make_plan(discover_model(wan), build_policy({}, 0, vae_tiling="on"))
    request = forecast_request(plan, RequestSize(height=480, width=832, frames=9), None, "unknown", None, "unknown")
    rows = {label: (value, note) for label, value, note in forecast_rows(plan, LinkInfo(is_cuda=False), request)}
    value, note = rows["VAE decode tiled"]
    assert "->" in value and "pixels differ" in note
    from rich.console import Console

    panel = PolicyPanel()
    shown: list = []
    panel.update = shown.append  # type: ignore[method-assign]  # the grid as the panel draws it
    panel.show_plan(plan)
    console = Console(width=200, record=True)
    console.print(shown[-1])
    text = console.export_text()
    assert any(line.split() == ["lean", "phases", "vae-tiling", "on"] for line in text.splitlines()), text


@pytest.mark.slow
def test_run_reports_the_lean_phases_it_applied(wan: Path, tmp_path: Path, capsys, wan_loadable):
    out = tmp_path / "fox.gif"
    assert main(["run", "--model", str(wan), "--device", "cpu", "--steps", "1", "--height", "32", "--width", "32",
                 "--frames", "5", "--output", str(out), "--vae-tiling", "on", "--stream-encoders", "on",
                 "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["policy"]["vae_tiling"] == "on" and report["policy"]["stream_encoders"] == "on"
    assert [line.split(":")[0] for line in report["lean_phases"]] == ["text encoders streamed layer by layer",
                                                                      "VAE decode tiled"]
    assert "lean phase: VAE decode tiled" in captured.err
    assert any("streamed layer by layer (24 layers through 2 slots" in line for line in report["log"]), report["log"]
