"""The benchmarks are one package run from the repository root (`python -m benchmarks.NAME`), sharing
`benchmarks/harness.py`: the common flags, the machine and versions in every report, JSON and CSV."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_benchmark_runs_as_a_module_with_the_common_flags() -> None:
    done = _run("-m", "benchmarks.cpu_exactness", "--help")
    assert done.returncode == 0, done.stderr
    for flag in ("--out", "--csv", "--tiny-dir"):
        assert flag in done.stdout


@pytest.mark.slow
def test_a_report_carries_its_machine_and_its_numbers_as_csv_rows(tmp_path: Path) -> None:
    out, rows = tmp_path / "r" / "report.json", tmp_path / "report.csv"
    code = textwrap.dedent(f"""
        from benchmarks import harness
        args = harness.parser("x", out="unused.json", device="cpu", iters=3).parse_args(
            ["--out", {str(out)!r}, "--csv", {str(rows)!r}])
        assert args.iters == 3 and args.device == "cpu"
        dlo = [{{"step_s": 0.5, "ratio_to_floor": harness.ratio(0.5, 0.4)}}]
        harness.write({{"dlo": dlo, "preset": "small"}}, args)
    """)
    done = _run("-c", code)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    import torch

    env = report["environment"]
    assert env["torch"] == torch.__version__ and env["device"] == "cpu" and env["date"][:2] == "20"
    assert report["dlo"][0]["ratio_to_floor"] == 1.25
    with open(rows, newline="") as f:
        table = dict(csv.reader(f))
    assert table["dlo.0.ratio_to_floor"] == "1.25" and table["preset"] == "small"
    assert table["environment.torch"] == torch.__version__


def test_no_benchmark_edits_sys_path_or_imports_the_tests() -> None:
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        text = script.read_text()
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        assert "sys.path.insert" not in code and "sys.path.append" not in code, script.name
        assert "import tiny_families" not in code and "from tests" not in code, script.name
