"""No import circle inside console/, counting the imports under `if TYPE_CHECKING:` (issue 24).

import-linter's `console-acyclic` contract skips those (they never run), but a circle through them is
still a circle to a reader and to a type checker: the command groups once named the app's class
(`self: OmniConsoleApp`) while the app imported them. This reads every module's imports with `ast`,
the ones under `TYPE_CHECKING` included, resolves the relative ones, and looks for a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import omni_console.console as console_package

ROOT = Path(console_package.__file__).resolve().parent
PACKAGE = "console"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = [PACKAGE, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str], root: Path = ROOT) -> set[str]:
    """The console modules `path` imports anywhere in its text (functions, TYPE_CHECKING blocks too)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from . import submodule`
    return {m for m in found if m in modules and m != name}


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    modules = set(files)
    return {name: imports_of(path, modules, root) for name, path in files.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_console_has_no_import_cycle_counting_type_checking_imports():
    edges = graph()
    assert "console.app" in edges and "console.load_commands" in edges["console.app"]  # the graph sees the app
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges) or [])


def test_a_cycle_through_a_type_checking_import_is_found(tmp_path):
    pkg = tmp_path / "console"
    (pkg / "screens").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "app.py").write_text("from .commands import Commands\nfrom .screens import Live\n")
    (pkg / "commands.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .app import App\n")
    (pkg / "screens" / "__init__.py").write_text("from .live import Live\n")
    (pkg / "screens" / "live.py").write_text("from .. import app\n")
    edges = graph(pkg)
    assert edges["console.commands"] == {"console.app"}
    assert find_cycle(edges) == ["console.app", "console.commands", "console.app"]
    (pkg / "commands.py").write_text("")
    assert find_cycle(graph(pkg)) == ["console.app", "console.screens", "console.screens.live", "console.app"]
    (pkg / "screens" / "live.py").write_text("")
    assert find_cycle(graph(pkg)) is None
