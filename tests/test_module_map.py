"""docs/modules.md, the architecture's appendix, is generated from the modules' docstrings and is current."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_tool():
    spec = importlib.util.spec_from_file_location("module_map", ROOT / "tools" / "module_map.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_module_map_is_current() -> None:
    tool = load_tool()
    written = (ROOT / "docs" / "modules.md").read_text()
    assert written == tool.module_map(), "docs/modules.md is stale: run python tools/module_map.py"
    for part in tool.PARTS:  # every module is in it, each once
        for path in (ROOT / part).rglob("*.py"):
            if "__pycache__" not in path.parts:
                section = f"## {path.parent.relative_to(ROOT).as_posix()}/\n"
                assert section in written and f"- `{path.name}`:" in written, path


def test_a_changed_docstring_makes_the_map_stale(tmp_path: Path) -> None:
    tool = load_tool()
    for part in tool.PARTS:
        (tmp_path / part).mkdir()
        (tmp_path / part / "one.py").write_text(f'"""The {part} floor\'s only module.\n\nDetail not shown."""\n')
    text = tool.module_map(tmp_path)
    assert "- `one.py`: The engine floor's only module." in text and "Detail" not in text
    (tmp_path / "engine" / "one.py").write_text('"""Now another job."""\n')
    assert tool.module_map(tmp_path) != text
    assert all(len(line) <= 120 for line in text.splitlines())
