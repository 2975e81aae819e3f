"""Layers point one way: console → engine → offload; only console/ imports Textual; console/ has no cycles.

The rules are import-linter contracts in pyproject.toml ([tool.importlinter]); these tests run every
one of them on the installed `omni_console` packages in the default (fast) suite, and once on a copy
with a forbidden import planted (slow), so a contract that stopped seeing the code would fail too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ("layers", "no-textual-below-console", "console-front-door", "console-without-torch",
             "console-state-without-textual", "console-acyclic", "engine-flow")
PARTS = ("console", "engine", "offload", "themes")

LINT = (
    "import sys\n"
    "from importlinter.cli import lint_imports\n"
    "sys.exit(lint_imports(config_filename=sys.argv[1], limit_to_contracts=tuple(sys.argv[2:]),"
    " no_cache=True, no_logo=True))\n"
)


def lint(*contracts: str, cwd: Path = ROOT, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`lint-imports` for `contracts`, in a fresh interpreter (it edits sys.path and logging)."""
    env = None if pythonpath is None else {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([sys.executable, "-c", LINT, str(ROOT / "pyproject.toml"), *contracts],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_every_contract_in_pyproject_is_checked_here():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert sorted(c["id"] for c in config["tool"]["importlinter"]["contracts"]) == sorted(CONTRACTS)


def test_every_contract_is_kept():
    """All of them in one run (under a second): the default suite holds the layering."""
    result = lint(*CONTRACTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(CONTRACTS)} kept, 0 broken" in result.stdout, result.stdout


def planted_copy(tmp_path: Path, modules: dict[str, str]) -> Path:
    """The four parts copied under tmp_path/omni_console/, plus `modules` ({"engine/_planted.py": source}).

    On PYTHONPATH the copy is found before the editable install's finder, so the contracts read it.
    """
    for name in PARTS:
        shutil.copytree(ROOT / name, tmp_path / "omni_console" / name, ignore=shutil.ignore_patterns("__pycache__"))
    for relpath, source in modules.items():
        (tmp_path / "omni_console" / relpath).write_text(source)
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize(("modules", "contract"), [
    ({"engine/_planted.py": "import textual\n"}, "no-textual-below-console"),
    ({"offload/_planted.py": "from textual.widget import Widget\n"}, "no-textual-below-console"),
    ({"engine/_planted.py": "from ..themes import THEMES\n"}, "no-textual-below-console"),
    ({"engine/_planted.py": "from ..console import cli\n"}, "layers"),
    ({"engine/model_dir/_planted.py": "from ..running import runner\n"}, "engine-flow"),
    ({"offload/_planted.py": "from ..engine import plan\n"}, "layers"),
    ({"console/_planted.py": "from ..engine.running import runner\n"}, "console-front-door"),
    ({"console/_planted.py": "def later():\n    import torch\n"}, "console-without-torch"),
    ({"engine/running/_planted.py": "from ..service import queue\n"}, "engine-flow"),
    ({"console/session.py": "from . import _planted\n", "console/_planted.py": "def later():\n    import textual\n"},
     "console-state-without-textual"),
    ({"console/_planted.py": "from . import _planted_too\n",
      "console/_planted_too.py": "def later():\n    from . import _planted\n"}, "console-acyclic"),
])
def test_planted_forbidden_import_breaks_its_contract(tmp_path, modules, contract):
    copy = planted_copy(tmp_path, modules)
    result = lint(contract, cwd=tmp_path, pythonpath=copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "0 kept, 1 broken" in result.stdout, result.stdout
    assert "_planted" in result.stdout, result.stdout
