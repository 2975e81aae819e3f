"""`--vram-budget auto`: the GPU's free memory now less a margin the plan shows; on a CPU one line, exit 2."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from cli_helpers import one_error_line
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_console.console.args import parse_budget
from omni_console.console.cli import main
from omni_console.console.size_arg import parse_size
from omni_console.engine.errors import ConfigError
from omni_console.engine.planning import auto_budget as ab

GB = 10**9


@pytest.fixture
def free_30gb(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    asked: list[int] = []

    def nvml_free(index: int) -> tuple[int, str]:
        asked.append(index)
        return 30 * GB, "NVML"

    monkeypatch.setattr(ab, "_nvml_free", nvml_free)
    return asked


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=14))
def test_a_budget_is_auto_in_any_spelling_or_exactly_what_a_size_parses_to(text: str):
    try:
        expected: int | Exception = parse_size(text)
    except ConfigError as exc:
        expected = exc
    if text.strip().lower() == "auto":
        with pytest.raises(ConfigError, match="no device memory to budget"):
            parse_budget(text, "cpu")
        return
    with contextlib.suppress(ConfigError):
        assert parse_budget(text, "cpu") == expected
        return
    assert isinstance(expected, ConfigError)  # refused by both, with the size's own line


@pytest.mark.parametrize("spelling", ["auto", " AUTO ", "Auto"])
def test_auto_is_free_memory_less_a_margin_and_says_so(free_30gb: list[int], spelling: str):
    budget = parse_budget(spelling, "cuda:1")
    margin = max(ab.AUTO_MIN_MARGIN, int(0.02 * 30 * GB))
    assert budget == 30 * GB - margin and free_30gb == [1]
    assert budget.note.startswith("budget auto: 29.4 GB = free now 30.0 GB (NVML) - margin 600.0 MB")


def test_auto_on_a_cpu_device_is_one_line_and_exit_2(demo_model_dir: Path, capsys):
    assert main(["plan", "--model", str(demo_model_dir), "--device", "cpu", "--vram-budget", "auto"]) == 2
    line = one_error_line(capsys)
    assert "--vram-budget auto: the device is cpu" in line and "24GB" in line


def test_auto_without_any_gpu_is_one_line_and_exit_2(demo_model_dir: Path, capsys, loads,
                                                     monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(ab, "_nvml_free", lambda index: None)
    monkeypatch.setattr(ab, "_torch_free", lambda index: None)
    assert main(["run", "--model", str(demo_model_dir), "--vram-budget", "auto", "--output",
                 str(demo_model_dir.parent / "never.png")]) == 2
    assert "no CUDA device answers here" in one_error_line(capsys) and loads == []


def test_plan_with_auto_shows_the_free_memory_and_margin_first(demo_model_dir: Path, capsys, free_30gb):
    assert main(["plan", "--model", str(demo_model_dir), "--json", "--vram-budget", "auto"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["auto_plan"]["budget_bytes"] == 30 * GB - 600_000_000
    assert doc["auto_plan"]["reasons"][0].startswith("budget auto: 29.4 GB = free now 30.0 GB")
