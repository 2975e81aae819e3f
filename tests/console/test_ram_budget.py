"""`--ram-budget SIZE|auto` as the operator meets it: parsed like `--vram-budget`, `auto` with its margin said,
the host tiers shown by `plan` (and in `plan --json`), and a budget nothing fits refused with one line, exit 2,
before anything loads."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_console.console.args import ram_budget_from_args
from omni_console.console.cli import main
from omni_console.console.size_arg import parse_size
from omni_console.engine.errors import ConfigError
from omni_console.engine.planning.documents import PlanDocument
from omni_console.engine.planning.ram_budget import AUTO_RAM_MIN_MARGIN, auto_ram_budget

PLAN = ["plan", "--device", "cpu", "--height", "64", "--width", "64"]


def _ram(text: str) -> int | None:
    return ram_budget_from_args(argparse.Namespace(ram_budget=text))


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=12), st.from_regex(r"\s*[0-9]{1,4}(\.[0-9]{0,2})?\s*(GB|gib|M|TB|kb)?\s*",
                                                     fullmatch=True)))
def test_sizes_parse_as_vram_budget_does_and_errors_name_the_flag(text):
    if text.strip().lower() == "auto":
        return
    try:
        expected = parse_size(text)
    except ConfigError as exc:
        with pytest.raises(ConfigError) as err:
            _ram(text)
        assert str(err.value) == str(exc).replace("--vram-budget", "--ram-budget")
        assert "--ram-budget" in str(err.value) and "\n" not in str(err.value)
        return
    assert _ram(text) == expected


def test_auto_is_available_at_start_less_the_margin_it_shows(monkeypatch: pytest.MonkeyPatch):
    budget = auto_ram_budget(available=(40 * 10**9, "MemAvailable"))
    assert budget == 36 * 10**9  # 10 % of 40 GB: more than the 1.5 GB floor
    assert "available at start 40.0 GB (MemAvailable) - margin 4.0 GB" in budget.note
    small = auto_ram_budget(available=(4 * 10**9, "the cgroup's memory limit"))
    assert small == 4 * 10**9 - AUTO_RAM_MIN_MARGIN and "cgroup" in small.note
    with pytest.raises(ConfigError, match="--ram-budget auto: only 1.0 GB of host memory available"):
        auto_ram_budget(available=(10**9, "MemAvailable"))
    from omni_console.engine.planning import ram_budget

    monkeypatch.setattr(ram_budget, "host_available", lambda: (20 * 10**9, "MemAvailable"))
    assert _ram(" AUTO ") == 18 * 10**9  # the flag's spelling, case and spaces as --vram-budget auto takes them


def test_plan_shows_the_host_tiers_and_its_json_holds_them(demo_model_dir: Path, capsys):
    assert main([*PLAN, "--model", str(demo_model_dir), "--ram-budget", "3GB"]) == 0
    out = capsys.readouterr().out
    assert "host tiers (--ram-budget)" in out and "pin cap" in out and "host peak" in out
    assert main([*PLAN, "--model", str(demo_model_dir), "--ram-budget", "3GB", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    ram = document["ram_plan"]
    assert ram["budget_bytes"] == 3 * 10**9 and ram["host_peak_bytes"] <= ram["budget_bytes"]
    assert ram["pinned_bytes"] + ram["page_cache_bytes"] + ram["disk_bytes"] > 0 and ram["reasons"]
    assert PlanDocument.model_validate(document).to_json_dict() == document
    assert main([*PLAN, "--model", str(demo_model_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ram_plan"] is None  # no budget, no host plan


@pytest.mark.parametrize("command", ["plan", "console"])
def test_a_budget_nothing_fits_is_one_line_naming_the_smallest_peak(demo_model_dir: Path, capsys, command):
    argv = [*PLAN] if command == "plan" else ["console"]
    assert main([*argv, "--model", str(demo_model_dir), "--ram-budget", "100MB"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "smallest possible host peak is " in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["-4GB", "0", "lots", "1e400"])
def test_a_bad_value_is_one_line_exit_2(demo_model_dir: Path, capsys, value):
    assert main([*PLAN, "--model", str(demo_model_dir), "--ram-budget", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("omni-console: error: --ram-budget") and "\n" not in err


@pytest.mark.slow
def test_run_refuses_a_budget_nothing_fits_before_loading(demo_model_dir: Path, tmp_path: Path, capsys):
    out = tmp_path / "out.png"
    code = main(["run", "--model", str(demo_model_dir), "--device", "cpu", "--steps", "1", "--height", "64",
                 "--width", "64", "--output", str(out), "--ram-budget", "100MB"])
    err = capsys.readouterr().err
    assert code == 2 and "smallest possible host peak" in err and not out.exists()
    lines = [line for line in err.splitlines() if line.startswith("omni-console: error")]
    assert len(lines) == 1 and "Traceback" not in err
    with contextlib.suppress(FileNotFoundError):
        assert not list(tmp_path.glob("out*"))


def test_auto_is_read_once_per_command(monkeypatch: pytest.MonkeyPatch):
    """`run` checks its flags before torch's import and again after: the second reading would count our growth."""
    from omni_console.engine.planning import ram_budget

    readings = iter([(20 * 10**9, "MemAvailable"), (10 * 10**9, "MemAvailable")])
    monkeypatch.setattr(ram_budget, "host_available", lambda: next(readings))
    args = argparse.Namespace(ram_budget="auto")
    assert ram_budget_from_args(args) == ram_budget_from_args(args) == 18 * 10**9


@pytest.mark.slow
def test_run_reports_the_host_tiers_and_its_image_is_the_same(demo_model_dir: Path, tmp_path: Path, capsys):
    from omni_console.engine.service.run_report import RunReport

    common = ["run", "--model", str(demo_model_dir), "--device", "cpu", "--steps", "2", "--height", "64",
              "--width", "64", "--json"]
    assert main([*common, "--output", str(tmp_path / "plain.png")]) == 0
    capsys.readouterr()
    assert main([*common, "--output", str(tmp_path / "ram.png"), "--ram-budget", "8GB"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    RunReport.model_validate(report)
    ram = report["ram_plan"]
    assert ram["budget_bytes"] == 8 * 10**9 and ram["host_peak_bytes"] <= ram["budget_bytes"] and ram["reasons"]
    assert "--ram-budget: pin cap" in captured.err
    assert (tmp_path / "ram.png").read_bytes() == (tmp_path / "plain.png").read_bytes()


@pytest.mark.parametrize("command", ["plan", "console", "run"])
def test_with_several_gpus_it_is_refused_not_misplanned(demo_model_dir: Path, tmp_path: Path, capsys, command):
    argv = {"plan": [*PLAN], "console": ["console"], "run": ["run", "--output", str(tmp_path / "o.png")]}[command]
    assert main([*argv, "--model", str(demo_model_dir), "--gpus", "2", "--ram-budget", "8GB"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--ram-budget with --gpus" in err and "\n" not in err and not (tmp_path / "o.png").exists()
