"""Lazy names (PEP 562) for the front door's namespaces: `plan` and the console's first frame must not
import torch, and most names here do, so a name's module is imported when the name is first read."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(module: str, package: str, exports: dict[str, tuple[str, ...]]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """`__getattr__`, `__dir__` and `__all__` for `module`, serving each name of `exports` ({module: names},
    relative to `package`) from its own module, looked up each time (a name patched there is the one served)."""
    where = {name: source for source, names in exports.items() for name in names}

    def getattr_(name: str) -> Any:
        source = where.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return getattr(importlib.import_module(source, package), name)

    def dir_() -> list[str]:
        return sorted(where)

    return getattr_, dir_, sorted(where)
