"""`run` is a thin face over the engine's service (issue 36): its console code — `headless.py` and
`headless_ranks.py` together — stays at about 150 lines, and the sequence (open, load, submit, wait, write,
report) is the engine's (`service.run_once`, `service.run_ranks`), not assembled again in the console."""

from __future__ import annotations

import ast
from pathlib import Path

import omni_console.console as console_package

RUN_MODULES = ("headless.py", "headless_ranks.py")
LIMIT = 150
SEQUENCE_CALLS = {"load", "submit", "wait", "write", "run_report", "ranks_report", "write_results"}
"""The steps of the use case: the engine's to call, the console's never (in `run`'s modules)."""


def test_run_is_at_most_150_lines_of_console_code() -> None:
    root = Path(console_package.__file__).parent
    counts = {name: len((root / name).read_text().splitlines()) for name in RUN_MODULES}
    assert sum(counts.values()) <= LIMIT, (
        f"`run` is {sum(counts.values())} lines of console code ({counts}), over {LIMIT}: move the sequence into "
        "engine/service (run_once.py, run_ranks.py) and keep the console to flags, progress lines and the report")


def test_run_calls_the_engines_use_case_not_its_steps() -> None:
    root = Path(console_package.__file__).parent
    called: set[str] = set()
    for name in RUN_MODULES:
        for node in ast.walk(ast.parse((root / name).read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
                called.add(node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
    assert not called & SEQUENCE_CALLS, f"run's console modules call the use case's steps: {called & SEQUENCE_CALLS}"
    assert {"run_once", "run_ranks"} <= _names(root / "headless.py")


def _names(path: Path) -> set[str]:
    return {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
