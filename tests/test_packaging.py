"""Every Python package folder of the four parts is installed (a missing entry breaks regular installs)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("console", "engine", "offload", "themes")


def test_every_package_folder_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapping = config["package-dir"]
    folders = {p.parent.relative_to(ROOT).as_posix() for part in PARTS for p in (ROOT / part).rglob("__init__.py")}
    expected = {"omni_console." + f.replace("/", ".") for f in folders}
    assert expected == listed
    for name in listed:
        assert mapping[name] == name.removeprefix("omni_console.").replace(".", "/")


def test_no_folder_shadows_the_namespace():
    """A folder named omni_console at the root would shadow the install when the cwd is on sys.path."""
    assert not (ROOT / "omni_console").exists()
