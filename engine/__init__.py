"""omni_console.engine: discovery, policy resolution, loading and running models (never Textual).

Its face is `engine.api` (the console imports only that, `events` and `errors`); the same names are
reachable here, loaded on first use so that importing the package stays cheap (no torch) — except a
name that is also one of the package's modules or subpackages: here that is the module.
"""

import importlib
from pathlib import Path
from typing import Any

from .offline import enforce_offline

enforce_offline()


def __getattr__(name: str) -> Any:
    """An `api` name, imported on first use; never a submodule's or subpackage's name (the
    import system imports those)."""
    here = Path(__file__).parent
    if name.startswith("_") or (here / f"{name}.py").exists() or (here / name / "__init__.py").exists():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    api = importlib.import_module(f"{__name__}.api")
    if name not in api.__all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(api, name)
