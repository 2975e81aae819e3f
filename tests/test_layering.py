"""Layers point one way: console → engine → offload. engine/ and offload/ never import Textual."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import importlib, pkgutil, sys
import omni_console.engine, omni_console.offload
for pkg in (omni_console.offload, omni_console.engine):
    for mod in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{mod.name}")
bad = sorted(m for m in sys.modules if m == "textual" or m.startswith("textual."))
print("TEXTUAL:" + ",".join(bad))
offload_to_engine = [m for m in sys.modules if m.startswith("omni_console.console")]
print("CONSOLE:" + ",".join(offload_to_engine))
"""


def test_engine_and_offload_import_no_textual_nor_console():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True).stdout
    assert "TEXTUAL:\n" in out, out
    assert "CONSOLE:\n" in out, out


def test_offload_does_not_import_engine():
    code = ("import importlib, pkgutil, sys, omni_console.offload as o\n"
            "[importlib.import_module(f'omni_console.offload.{m.name}') for m in pkgutil.iter_modules(o.__path__)]\n"
            "print([m for m in sys.modules if m.startswith('omni_console.engine')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
