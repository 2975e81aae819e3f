"""The console reaches below it through a narrow door: at most 30 names in all from `engine.api`,
`engine.events`, `engine.errors` and `offload.units` (or the engine and offload packages themselves),
counted over every console module's imports: top-level, in functions and under `if TYPE_CHECKING:`."""

from __future__ import annotations

import ast
from pathlib import Path

import omni_console.console as console_package

LIMIT = 30
BELOW = ("engine", "offload")


def names_from_below(path: Path, source: str | None = None) -> set[tuple[str, str]]:
    """(module, name) for each name the module at `path` (a console module) imports from below."""
    tree = ast.parse(path.read_text() if source is None else source)
    package = ["console", *path.relative_to(Path(console_package.__file__).parent).parent.parts]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = (node.module or "").removeprefix("omni_console.")
            if module.split(".")[0] in BELOW:
                found |= {(module, alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {(alias.name.removeprefix("omni_console."), "") for alias in node.names
                      if alias.name.removeprefix("omni_console.").split(".")[0] in BELOW}
    return found


def console_names() -> set[tuple[str, str]]:
    root = Path(console_package.__file__).parent
    return {pair for path in sorted(root.rglob("*.py")) for pair in names_from_below(path)}


def test_the_console_imports_at_most_30_names_from_below() -> None:
    names = console_names()
    assert len(names) <= LIMIT, f"{len(names)} names: " + ", ".join(sorted(f"{m}:{n}" for m, n in names))
    # the door itself is what is used: the service, the planner and the events all come through it
    assert {("engine.api", "service"), ("engine.api", "planner"), ("engine", "events")} <= names


def test_the_count_sees_every_kind_of_import() -> None:
    """Relative and absolute, in a function, under TYPE_CHECKING, from a subpackage: each is counted."""
    widget = Path(console_package.__file__).parent / "widgets" / "planted.py"
    source = ("from typing import TYPE_CHECKING\n"
              "from ...engine.api import Plan, planner\n"
              "from omni_console.offload.units import format_bytes\n"
              "from ...engine import events\n"
              "import omni_console.engine.running.runner\n"
              "if TYPE_CHECKING:\n    from ...engine.api import ModelInfo\n"
              "def later():\n    from ..rank_stats import RankStats\n    from ...engine.errors import ConfigError\n")
    assert names_from_below(widget, source) == {
        ("engine.api", "Plan"), ("engine.api", "planner"), ("offload.units", "format_bytes"), ("engine", "events"),
        ("engine.running.runner", ""), ("engine.api", "ModelInfo"), ("engine.errors", "ConfigError")}
